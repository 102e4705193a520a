"""Arena region reused on another stream waits for its earlier user (GPU)."""
import pytest
import torch

from graphrt.arena import WorkspaceArena

pytestmark = pytest.mark.gpu


def test_cross_stream_reuse_waits_for_the_earlier_user():
    arena = WorkspaceArena(1 << 20, "cuda")
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(first), arena.scope():
        region = arena.take(4096, first)
        torch.cuda._sleep(int(2e9 * 0.05))  # 50 ms of GPU time before the first user writes
        region.fill_(1)
    with torch.cuda.stream(second), arena.scope():
        again = arena.take(4096, second)    # same bytes: must wait for the first stream
        assert again.data_ptr() == region.data_ptr()
        again.fill_(2)
    torch.cuda.synchronize()
    assert bool((again == 2).all()), "the second stream wrote before the first one finished"


def test_stream_tracker_makes_the_consumer_wait_for_the_producer():
    from graphrt.streams import StreamTracker, resolve_stream

    tracker = StreamTracker()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    buf = torch.zeros(1 << 20, device="cuda")
    with torch.cuda.stream(producer):
        torch.cuda._sleep(int(2e9 * 0.05))
        buf.fill_(3)
    tracker.produced(buf, producer)
    tracker.consume(buf, consumer)          # consumer waits for the producer's event
    with torch.cuda.stream(consumer):
        total = buf.sum()
    torch.cuda.synchronize()
    assert total.item() == 3 * (1 << 20)
    assert resolve_stream(None, buf.device) == torch.cuda.current_stream()
    assert resolve_stream(producer.cuda_stream, buf.device).cuda_stream == producer.cuda_stream
