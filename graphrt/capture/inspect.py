"""Reading a captured cudaGraph_t through cuda-python: node kinds and the graph's shape."""
from __future__ import annotations

from collections import Counter


def _runtime():
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:  # older cuda-python layout
        from cuda import cudart
    return cudart


def _check(result):
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"cuda-python call failed: {err}")
    return result[1:]


def _handle(x) -> int:
    try:
        return int(x)
    except TypeError:
        return int(x.getPtr())


def _graph_nodes(raw_graph: int):
    cudart = _runtime()
    graph = cudart.cudaGraph_t(init_value=raw_graph)
    _, count = _check(cudart.cudaGraphGetNodes(graph, 0))
    nodes, _ = _check(cudart.cudaGraphGetNodes(graph, count)) if count else ([], 0)
    nodes = [n for n in nodes if n is not None][:count]
    edges = _check(cudart.cudaGraphGetEdges(graph, 0))
    n_edges = edges[-1]
    froms, tos = [], []
    if n_edges:
        got = _check(cudart.cudaGraphGetEdges(graph, n_edges))
        froms, tos = got[0], got[1]
    return cudart, graph, nodes, list(zip(froms, tos))[:n_edges]


_KINDS = {"cudaGraphNodeTypeKernel": "kernel", "cudaGraphNodeTypeMemcpy": "memcpy",
          "cudaGraphNodeTypeMemset": "memset", "cudaGraphNodeTypeMemAlloc": "alloc",
          "cudaGraphNodeTypeMemFree": "alloc"}


def _kind(cudart, node) -> str:
    (node_type,) = _check(cudart.cudaGraphNodeGetType(node))
    return _KINDS.get(getattr(node_type, "name", str(node_type)).split(".")[-1], "other")


def node_counts(raw_graph: int) -> dict[str, int]:
    """Counts of a graph's nodes by kind: kernel, memcpy, memset, alloc (alloc and free), other."""
    cudart, _, nodes, _ = _graph_nodes(raw_graph)
    counts = Counter({"kernel": 0, "memcpy": 0, "memset": 0, "alloc": 0, "other": 0})
    for node in nodes:
        counts[_kind(cudart, node)] += 1
    counts["total"] = len(nodes)
    return dict(counts)


def graph_shape(raw_graph: int) -> dict[str, int]:
    """Depth (longest dependency chain, in nodes) and the largest number of kernel nodes at one
    depth: two or more means kernels on parallel branches that may run at once."""
    cudart, _, nodes, edges = _graph_nodes(raw_graph)
    index = {_handle(n): i for i, n in enumerate(nodes)}
    parents: list[list[int]] = [[] for _ in nodes]
    for src, dst in edges:
        parents[index[_handle(dst)]].append(index[_handle(src)])
    depth = [-1] * len(nodes)

    def depth_of(i: int) -> int:
        stack = [i]
        while stack:
            j = stack[-1]
            pending = [p for p in parents[j] if depth[p] < 0]
            if pending:
                stack.extend(pending)
                continue
            depth[j] = 1 + max((depth[p] for p in parents[j]), default=-1)
            stack.pop()
        return depth[i]

    for i in range(len(nodes)):
        depth_of(i)
    kinds = [_kind(cudart, n) for n in nodes]
    per_depth = Counter(d for d, k in zip(depth, kinds) if k == "kernel")
    return {"nodes": len(nodes), "edges": len(edges), "depth": 1 + max(depth, default=-1),
            "max_parallel_kernels": max(per_depth.values(), default=0)}


_COLOURS = {"kernel": "lightblue", "memcpy": "khaki", "memset": "lightgrey", "alloc": "salmon",
            "other": "white"}


def dot_text(kinds: list[str], edges: list[tuple[int, int]], title: str = "graph") -> str:
    """Graphviz DOT of a graph given each node's kind and the (from, to) node index pairs."""
    lines = [f'digraph "{title}" {{', "  rankdir=TB;", '  node [shape=box, style=filled];']
    for i, kind in enumerate(kinds):
        lines.append(f'  n{i} [label="{i}: {kind}", fillcolor={_COLOURS.get(kind, "white")}];')
    lines += [f"  n{a} -> n{b};" for a, b in edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def graph_dot(raw_graph: int, title: str = "graph") -> str:
    """The captured graph as Graphviz DOT: one box per node (its kind), its dependency edges; a
    parallel branch shows as boxes side by side."""
    cudart, _, nodes, edges = _graph_nodes(raw_graph)
    index = {_handle(n): i for i, n in enumerate(nodes)}
    return dot_text([_kind(cudart, n) for n in nodes],
                    [(index[_handle(s)], index[_handle(d)]) for s, d in edges], title)


def write_picture(dot: str, path) -> list:
    """Write ``dot`` to ``path`` (.dot) and, where Graphviz's ``dot`` is installed, a PNG
    beside it; returns the paths written."""
    import shutil
    import subprocess
    from pathlib import Path

    path = Path(path).with_suffix(".dot")
    path.write_text(dot)
    written = [path]
    exe = shutil.which("dot")
    if exe is not None:
        png = path.with_suffix(".png")
        if subprocess.run([exe, "-Tpng", str(path), "-o", str(png)], capture_output=True).returncode == 0:
            written.append(png)
    return written
