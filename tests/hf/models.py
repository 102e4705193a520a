"""Tiny Hugging Face decoder models built from configs (random weights, nothing downloaded)."""
import torch

transformers = __import__("pytest").importorskip("transformers")

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
}


def tiny(family: str, device="cpu", hidden=64, layers=2, vocab=128, attn="sdpa", seed=0):
    config_cls, model_cls = FAMILIES[family]
    config = config_cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                        vocab_size=vocab, max_position_embeddings=256)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = model_cls(config).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():   # norms away from their initial value, so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model
