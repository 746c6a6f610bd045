"""Prefill on the GPU: time per call of ``ffi_dsa.prefill_call`` over one causal prompt, as
the chain kit chunks it (rows [r0, r1) of a P-token prompt see keys [0, i + 1)), and the rate in
causal FLOPs (2 x H x 128 per (row, key) pair a row sees) per second.

    python benchmarks/bench_prefill.py [--prompts 8192,32768,65536] [--chunk-rows 0] [--calls 8]
        [--reps 20] [--profile-chunk]          (a CUDA GPU; chunk rows 0: as the kit, logits <= 512 MiB)

Per prompt, each chunk's call is captured `--calls` times in one CUDA graph (inputs: the prompt's q,
k, k_scale, weights, ks, ke; ids written to one output) and the graph replayed `--reps` times; the
median replay over the calls is the time per call. A prefill call reads a few MB of keys per chunk
and is compute-bound, so L2-cold inputs would not change it: the rate is the figure of merit.
``--profile-chunk`` runs only the prompt's last chunk once (for ncu: ``ncu --kernel-name
regex:Prefill ... python benchmarks/bench_prefill.py --prompts 65536 --profile-chunk``).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch  # noqa: E402

import ffi_dsa  # noqa: E402

HEADS, DIM, TOPK = 64, 128, 2048
MAX_LOGITS_BYTES = 512 << 20  # the kit's and vLLM's chunking


def chunks_of(prompt: int, chunk_rows: int) -> list[tuple[int, int]]:
    rows = chunk_rows or max(1, MAX_LOGITS_BYTES // (4 * prompt))
    return [(a, min(prompt, a + rows)) for a in range(0, prompt, rows)]


def prompt_tensors(prompt: int, seed: int = 5):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(prompt, HEADS, DIM, device="cuda", generator=g).to(torch.float8_e4m3fn)
    k = torch.randn(prompt, DIM, device="cuda", generator=g).to(torch.float8_e4m3fn)
    k_scale = torch.rand(prompt, device="cuda", generator=g) + 0.5
    w = torch.randn(prompt, HEADS, device="cuda", generator=g) * HEADS ** -0.5
    ke = torch.arange(1, prompt + 1, device="cuda", dtype=torch.int32)
    ks = torch.zeros(prompt, device="cuda", dtype=torch.int32)
    return q, k, k_scale, w, ks, ke


def call_chunk(t, out, a: int, b: int) -> None:
    q, k, k_scale, w, ks, ke = t
    ffi_dsa.prefill_call(q[a:b], k[:b], k_scale[:b], w[a:b], ks[a:b], ke[a:b], out[a:b])


def time_prompt(prompt: int, chunk_rows: int, calls: int, reps: int) -> dict:
    t = prompt_tensors(prompt)
    out = torch.empty(prompt, TOPK, dtype=torch.int32, device="cuda")
    total = 0.0
    for a, b in chunks_of(prompt, chunk_rows):
        call_chunk(t, out, a, b)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                call_chunk(t, out, a, b)
        graph.replay()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
        total += statistics.median(times)
    flops = 2.0 * HEADS * DIM * prompt * (prompt + 1) / 2
    return {"prompt": prompt, "chunks": len(chunks_of(prompt, chunk_rows)), "ms": total,
            "tflops": flops / (total * 1e-3) / 1e12}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="8192,32768,65536")
    ap.add_argument("--chunk-rows", type=int, default=0)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--profile-chunk", action="store_true")
    a = ap.parse_args(argv)
    print(torch.cuda.get_device_name(0), flush=True)
    for prompt in (int(p) for p in a.prompts.split(",")):
        if a.profile_chunk:
            t = prompt_tensors(prompt)
            out = torch.empty(prompt, TOPK, dtype=torch.int32, device="cuda")
            call_chunk(t, out, *chunks_of(prompt, a.chunk_rows)[-1])
            torch.cuda.synchronize()
            continue
        r = time_prompt(prompt, a.chunk_rows, a.calls, a.reps)
        print(f"prompt {r['prompt']:6d}: {r['chunks']:3d} chunks, {r['ms']:8.2f} ms per prompt, "
              f"{r['tflops']:6.0f} TFLOP/s causal", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
