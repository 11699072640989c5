"""Where models spend their time: persistent_matmul.linear against F.linear on real-model shapes.

Three parts, each a table with ratios to torch measured in the same run (GPU, clocks,
torch/CUDA versions and commit in the header):

* **host**: what one call costs the host. M=1, 4096x4096 bf16 (and a 1x256x256 product,
  whose GPU time is negligible), 1000 back-to-back calls under ``torch.no_grad()``: the
  wall time per call (the loop and a final synchronize) and the time the loop itself
  took per call (enqueueing only: the host cost, whenever the GPU keeps up), for
  torch.matmul / F.linear / an nn.Linear module against pm.matmul / pm.linear / a
  module running MatmulLinear.forward; and the floor, what torch's cheapest calls
  (an allocation, one kernel into an existing tensor) cost the same host.
* **shapes**: the projections of Llama-3-8B and Llama-3-70B (N x K below) at decode M
  (1 ... 256) and prefill M (512 ... 16384): ``pm.linear(x, w, kernel=...)`` against
  ``F.linear(x, w)``, per call eager (back-to-back calls, CUDA events) and inside a CUDA
  graph (one graph of several calls, replayed), weights rotated through enough copies
  that the set exceeds the L2 cache three times, in interleaved rounds (the median
  kept); TFLOP/s, GB/s (weights + x + output, each once) and the ratio, plus each
  kernel's normwise error against an fp32 product of the same inputs and the SM clock
  and power nvidia-smi reads right after the case.
* **model**: a Llama-3-8B-shaped LlamaForCausalLM built from its config (hidden 4096,
  intermediate 14336, 32 heads, 8 KV heads, vocab 128256, 4 layers, random weights,
  nothing downloaded), bf16: prefill of 1x2048 and 4x2048 tokens, and a decode step
  with a static KV cache (512 tokens of prompt) at batch 1 and 32, eager and as a
  captured CUDA graph, torch's nn.Linear against every Linear kernelized to
  MatmulLinear: two models with the same weights, timed in interleaved rounds (the
  median kept); logits compared (normwise relative error). Below it, per decode step,
  the graph ratio no kernelized model can beat: torch's forward with its Linear layers
  skipped, plus their weights read at the copy bandwidth. The shapes part gives the
  same bound per decode case (each case's bytes at the copy bandwidth).

    python scripts/model_benchmark.py [--parts host shapes model] [--kernels auto] [--out DIR] [--tag T]

Writes ``<date>-<tag>.md`` and ``.json`` to --out (default benchmarks/results, tag
model-benchmark). Needs a GPU and the build in build/.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.checks import DECODE_M, MODEL_PROJECTIONS as PROJECTIONS, PREFILL_M
from harness.kernel import REPO_ROOT as ROOT, load_kernel
from harness.provenance import command_line, environment, environment_lines, gpu_clocks
from harness.results import RESULTS_DIR, result_path
from harness.timing import (L2_ROTATION_BYTES, batch_time, calls_per_batch, geomean, interleaved_times,
                            time_per_call, warm_up_gpu)

sys.path.insert(0, str(ROOT / "examples"))  # kernelize_linear: the examples are scripts, not a package

DTYPE = torch.bfloat16
GRAPH_OUTPUT_BYTES = 4 * 2**30  # outputs a captured graph may hold at once (each call allocates its own)


# ------------------------------------------------------------------------------ timing


def capture(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn(i)`` for i in range(calls), captured on a side stream after
    one warm-up call per i there, and replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):
            fn(i)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    return graph


# ------------------------------------------------------------------------------ part 1: host cost


def per_call_us(fn, calls: int, repeats: int) -> tuple[float, float]:
    """(wall, enqueue) microseconds per call of ``fn``: the medians over ``repeats`` loops of
    ``calls`` back-to-back calls (wall: the loop and a final synchronize; enqueue: the loop)."""
    walls, loops = [], []
    for _ in range(repeats):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        loops.append((t1 - t0) / calls * 1e6)
        walls.append((t2 - t0) / calls * 1e6)
    return statistics.median(walls), statistics.median(loops)


def host_floor(calls: int = 1000, repeats: int = 5) -> dict[str, float]:
    """What torch's cheapest calls cost this host, per call (enqueue, us): allocating a
    1x4096 bf16 tensor, one kernel through the dispatcher into an existing tensor
    (``out.zero_()``), and both (``torch.zeros``): below what any op that returns a new
    CUDA tensor can cost here, ours and torch's alike."""
    out = torch.empty(1, 4096, device="cuda", dtype=DTYPE)
    probes = {"torch.empty(1, 4096)": lambda: torch.empty(1, 4096, device="cuda", dtype=DTYPE),
              "out.zero_()": out.zero_,
              "torch.zeros(1, 4096)": lambda: torch.zeros(1, 4096, device="cuda", dtype=DTYPE)}
    with torch.no_grad():
        floor = {name: per_call_us(fn, calls, repeats)[1] for name, fn in probes.items()}
    print(json.dumps({"host_floor_us": {k: round(v, 2) for k, v in floor.items()}}), flush=True)
    return floor


def host_cost(pm, calls: int = 1000, repeats: int = 5) -> list[dict]:
    """Per-call wall and enqueue time of each way to compute x @ w.T (see the module docstring)."""
    rows = []
    for n, k in ((4096, 4096), (256, 256)):
        x = torch.randn(1, k, device="cuda", dtype=DTYPE)
        w = torch.randn(n, k, device="cuda", dtype=DTYPE)
        bias = torch.randn(n, device="cuda", dtype=DTYPE)
        module = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=DTYPE)
        kernelized = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=DTYPE)
        kernelized.forward = types.MethodType(pm.layers.MatmulLinear.forward, kernelized)
        wt = w.t()
        pairs = [  # (ours, torch's): the same computation
            ("pm.matmul(x, w.t())", lambda: pm.matmul(x, wt), "torch.matmul(x, w.t())", lambda: torch.matmul(x, wt)),
            ("pm.linear(x, w)", lambda: pm.linear(x, w), "F.linear(x, w)", lambda: F.linear(x, w)),
            ("pm.linear(x, w, bias)", lambda: pm.linear(x, w, bias), "F.linear(x, w, bias)",
             lambda: F.linear(x, w, bias)),
            ("MatmulLinear module", lambda: kernelized(x), "nn.Linear module", lambda: module(x)),
        ]
        with torch.no_grad():
            for ours, ours_fn, theirs, theirs_fn in pairs:
                result = {"shape": f"1x{n}x{k}", "ours": ours, "torch": theirs}
                for key, fn in (("ours", ours_fn), ("torch", theirs_fn)):
                    result[f"{key}_wall_us"], result[f"{key}_enqueue_us"] = per_call_us(fn, calls, repeats)
                result["ratio_wall"] = result["ours_wall_us"] / result["torch_wall_us"]
                result["ratio_enqueue"] = result["ours_enqueue_us"] / result["torch_enqueue_us"]
                rows.append(result)
                print(json.dumps({k_: (round(v, 2) if isinstance(v, float) else v) for k_, v in result.items()}),
                      flush=True)
    return rows


def host_markdown(rows: list[dict], floor: dict[str, float]) -> list[str]:
    floor_text = ", ".join(f"`{name}` {us:.2f} us" for name, us in floor.items())
    lines = ["## Host cost per call", "",
             f"The floor on this host (enqueue per call, the same loops): {floor_text}.", "",
             "1000 back-to-back calls under torch.no_grad(), median of 5 repeats; wall: the loop plus a final "
             "synchronize, per call; enqueue: the loop alone, per call (the host's cost while the GPU keeps up); "
             "ratio: ours / torch's (below 1: ours costs less).", "",
             "| M x N x K | ours | us wall | us enqueue | torch | us wall | us enqueue | wall ratio | enqueue ratio |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['ours']} | {r['ours_wall_us']:.2f} | {r['ours_enqueue_us']:.2f} | "
                     f"{r['torch']} | {r['torch_wall_us']:.2f} | {r['torch_enqueue_us']:.2f} | "
                     f"{r['ratio_wall']:.2f} | {r['ratio_enqueue']:.2f} |")
    return lines + [""]


# ------------------------------------------------------------------------------ part 2: the shape set


def weight_sets(n: int, k: int) -> list[torch.Tensor]:
    """Random normal weights, as many copies (1 to 8) as make the set exceed the L2 cache three times."""
    sets = max(1, min(8, math.ceil(L2_ROTATION_BYTES / (n * k * 2))))
    return [torch.randn(n, k, device="cuda", dtype=DTYPE) / math.sqrt(k) for _ in range(sets)]


def parse_kernel_spec(text: str) -> tuple[str, dict[str, int]]:
    """A --kernels value: a kernel= name, or a name with matmul's cluster_size, as
    ``wgmma_streamk:cluster_size=1``."""
    name, _, options = text.partition(":")
    if not options:
        return name, {}
    match = re.fullmatch(r"cluster_size=([0-9]+)", options)
    if match is None:
        raise argparse.ArgumentTypeError(f"unknown kernel option {options!r} in {text!r}; the one taken: "
                                         f"cluster_size=N")
    return name, {"cluster_size": int(match[1])}


def kernel_spec(text: str) -> str:
    """argparse's type of --kernels: the spec itself, once parse_kernel_spec takes it."""
    parse_kernel_spec(text)
    return text


def kernel_runner(pm, spec: str, x: torch.Tensor, weights: list[torch.Tensor]):
    """``fn(i)``: the product of x and the i-th weight set (rotating) by the kernel ``spec``
    names: pm.linear, or with an option pm.matmul(x, w.t(), ...), which takes it (the same
    product and op entry; the host cost of matmul's option checks comes with it)."""
    name, options = parse_kernel_spec(spec)
    sets = len(weights)
    if options:
        return lambda i: pm.matmul(x, weights[i % sets].t(), kernel=name, **options)
    return lambda i: pm.linear(x, weights[i % sets], kernel=name)


def bench_projection(pm, name: str, n: int, k: int, ms: tuple[int, ...], kernels: list[str],
                     rounds: int) -> list[dict]:
    weights = weight_sets(n, k)
    sets = len(weights)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=DTYPE)
        reference = F.linear(x.float(), weights[0].float())
        runners = {"torch": lambda i: F.linear(x, weights[i % sets])}
        for kernel in kernels:
            runners[kernel] = kernel_runner(pm, kernel, x, weights)
        row = {"projection": name, "m": m, "n": n, "k": k, "weight_sets": sets, "results": {}}
        calls, batches = {}, {}
        with torch.no_grad():
            for col, fn in runners.items():
                out = fn(0)
                torch.cuda.synchronize()
                err = (out.float() - reference).norm().item() / max(reference.norm().item(), 1e-30)
                probe = time_per_call(fn, 1, 1)
                calls[col] = max(sets, calls_per_batch(probe))
                batches[col] = 5 if probe < 0.05 else 2
                row["results"][col] = {"rel_error": err}
            # Each column twice: its eager calls, and replays of one graph of several
            # calls (per call: the replay's time over its calls), all interleaved.
            graph_calls, timed, timed_calls, timed_batches = {}, {}, {}, {}
            for col, fn in runners.items():
                timed[col], timed_calls[col], timed_batches[col] = fn, calls[col], batches[col]
                graph_calls[col] = max(1, min(calls[col], 4 * sets, GRAPH_OUTPUT_BYTES // (m * n * 2)))
                try:
                    graph = capture(fn, graph_calls[col])
                except Exception as exc:  # noqa: BLE001 - a capture failure is a result to report
                    row["results"][col]["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
                    continue
                timed[f"{col} graph"] = lambda _, graph=graph: graph.replay()
                timed_calls[f"{col} graph"] = max(1, calls[col] // graph_calls[col])
                timed_batches[f"{col} graph"] = batches[col]
            times = interleaved_times(timed, timed_calls, timed_batches, rounds)
            # The state the case ran in: the large prefill products run at the
            # power limit, where the SM clock, and with it the ratios, move.
            row["clocks_after"] = gpu_clocks()
            eager = {col: times[col] for col in runners}
            graph = {col: [t / graph_calls[col] for t in times.get(f"{col} graph", [])] for col in runners}
            del timed
        flop = 2.0 * m * n * k
        moved = bytes_moved(m, n, k)
        for col in runners:
            res = row["results"][col]
            for mode, times in (("eager", eager[col]), ("graph", graph[col])):
                if times:
                    seconds = statistics.median(times)
                    res[f"{mode}_us"] = seconds * 1e6
                    res[f"{mode}_tflops"] = flop / seconds / 1e12
                    res[f"{mode}_gbs"] = moved / seconds / 1e9
        base = row["results"]["torch"]
        for col in kernels:
            res = row["results"][col]
            for mode in ("eager", "graph"):
                if f"{mode}_us" in res and f"{mode}_us" in base:
                    res[f"{mode}_ratio"] = base[f"{mode}_us"] / res[f"{mode}_us"]
        rows.append(row)
        print(json.dumps({"projection": name, "m": m, "n": n, "k": k,
                          **{f"{c}_{mode}": round(r.get(f"{mode}_us", float("nan")), 2)
                             for c, r in row["results"].items() for mode in ("eager", "graph")},
                          **{f"{c}_err": f"{r['rel_error']:.1e}" for c, r in row["results"].items()}}), flush=True)
        del x, reference
    del weights
    torch.cuda.empty_cache()
    return rows


def bytes_moved(m: int, n: int, k: int) -> float:
    """The bytes an m x n x k bf16 product reads and writes, each once: weights, x and output."""
    return 2.0 * (n * k + m * k + m * n)


def copy_speed_ceiling(rows: list[dict], mode: str, copy_gbs: float) -> tuple[float, float]:
    """The geomean and the highest ratio to torch's ``mode`` times that a kernel would
    reach if it moved each case's bytes (bytes_moved) at the copy bandwidth and cost
    nothing else: what no kernel can beat where the weights must come from memory."""
    ratios = [r["results"]["torch"][f"{mode}_us"] * 1e-6 / (bytes_moved(r["m"], r["n"], r["k"]) / (copy_gbs * 1e9))
              for r in rows if r["results"]["torch"].get(f"{mode}_us")]
    return (geomean(ratios), max(ratios)) if ratios else (math.nan, math.nan)


def clock_cell(row: dict) -> str:
    """A case's SM clock and power draw as sampled after it ("" where none was)."""
    clocks = row.get("clocks_after") or {}
    return ", ".join(clocks[key] for key in ("sm_clock", "power_draw") if clocks.get(key))


def shapes_markdown(rows: list[dict], kernels: list[str], copy_gbs: float) -> list[str]:
    lines = ["## Projections of Llama-3-8B and -70B", "",
             f"F.linear (torch) against pm.linear; bf16, no bias; us per call (eager: back-to-back calls; graph: "
             f"replays of one CUDA graph of several calls), weights rotated past the L2 cache, interleaved rounds, "
             f"median; ratio: torch's time / ours (above 1: ours faster); GB/s: weights + x + output once each "
             f"(device-to-device copy on this GPU: {copy_gbs:.0f} GB/s, read + write); SM clock and power: "
             f"nvidia-smi's right after the case's last round.", ""]
    for kernel in kernels:
        lines += [f"### kernel={kernel!r}", "",
                  "| projection | M x N x K | torch eager us | ours eager us | eager ratio | torch graph us | "
                  "ours graph us | graph ratio | ours graph TFLOP/s | ours graph GB/s | rel. error | "
                  "SM clock, power |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            t, o = r["results"]["torch"], r["results"][kernel]
            flag = "" if o["rel_error"] < 1e-2 else " **WRONG**"
            lines.append(
                f"| {r['projection']} | {r['m']}x{r['n']}x{r['k']} | {t.get('eager_us', math.nan):.1f} | "
                f"{o.get('eager_us', math.nan):.1f} | {o.get('eager_ratio', math.nan):.2f} | "
                f"{t.get('graph_us', math.nan):.1f} | {o.get('graph_us', math.nan):.1f} | "
                f"{o.get('graph_ratio', math.nan):.2f} | {o.get('graph_tflops', math.nan):.1f} | "
                f"{o.get('graph_gbs', math.nan):.0f} | {o['rel_error']:.1e}{flag} | {clock_cell(r)} |")
        lines.append("")
        for label, ms in (("decode", DECODE_M), ("prefill", PREFILL_M)):
            sub = [r for r in rows if r["m"] in ms]
            for mode in ("eager", "graph"):
                ratios = [r["results"][kernel].get(f"{mode}_ratio") for r in sub]
                ratios = [x for x in ratios if x]
                if ratios:
                    worst = min((r["results"][kernel][f"{mode}_ratio"], r["projection"], r["m"]) for r in sub
                                if r["results"][kernel].get(f"{mode}_ratio"))
                    lines.append(f"- {label} set, {mode}: geomean ratio {geomean(ratios):.3f} over {len(ratios)} "
                                 f"cases; lowest {worst[0]:.2f} ({worst[1]}, M={worst[2]})")
                    if label == "decode":
                        ceiling, highest = copy_speed_ceiling(sub, mode, copy_gbs)
                        lines.append(f"  - at most {ceiling:.3f} (highest {highest:.2f}): the ratio of a kernel "
                                     f"that moved each case's bytes at the copy bandwidth and cost nothing else")
        small = [r["results"][kernel].get("graph_gbs") for r in rows if r["m"] <= 16]
        small = [x for x in small if x]
        if small:
            lines.append(f"- M <= 16, graph: weights and activations at {min(small):.0f}-{max(small):.0f} GB/s, "
                         f"{min(small) / copy_gbs:.0%}-{max(small) / copy_gbs:.0%} of the copy bandwidth")
        lines.append("")
    return lines


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, GB/s counting bytes read plus bytes written (median of 10)."""
    src = torch.randn(2**30 // 2, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = time_per_call(lambda _: dst.copy_(src), 1, 10)
    return 2 * src.numel() * src.element_size() / seconds / 1e9


# ------------------------------------------------------------------------------ part 3: the model


def llama3_8b_config(layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                       max_position_embeddings=8192, rope_theta=500000.0)


def random_llama(config):
    """A LlamaForCausalLM of ``config`` on the GPU in DTYPE, eval mode, its random weights
    the same on every call (seed 0)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        return LlamaForCausalLM(config).to(DTYPE).eval()


def model_cases(model, config, prompt: int = 512, *, device: str = "cuda",
                prefills: tuple[tuple[int, int], ...] = ((1, 2048), (4, 2048)),
                decode_batches: tuple[int, ...] = (1, 32)):
    """(name, tokens, forward, prefill) of each case: forward() runs one step on static
    tensors (capturable in a CUDA graph) and returns the logits; prefill, if not None,
    fills the KV cache with the prompt first. Prefill cases of each (batch, sequence)
    in ``prefills``, decode steps of each batch in ``decode_batches``; the same inputs
    on every call (and every rank) for the same arguments."""
    from transformers import StaticCache

    gen = torch.Generator(device=device).manual_seed(1)
    cases = []
    for batch, seq in prefills:
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=device, generator=gen)
        cases.append((f"prefill {batch}x{seq}", batch * seq, lambda ids=ids: model(input_ids=ids, use_cache=False).logits,
                      None))
    for batch in decode_batches:
        prompt_ids = torch.randint(0, config.vocab_size, (batch, prompt), device=device, generator=gen)
        step_ids = torch.randint(0, config.vocab_size, (batch, 1), device=device, generator=gen)
        cache = StaticCache(config=config, max_cache_len=prompt + 8)
        position = torch.tensor([prompt], device=device)

        def prefill(prompt_ids=prompt_ids, cache=cache):
            cache.reset()
            model(input_ids=prompt_ids, past_key_values=cache, cache_position=torch.arange(prompt, device=device),
                  use_cache=True)

        def step(step_ids=step_ids, cache=cache, position=position):
            # The static cache counts the tokens it holds on the GPU and appends at
            # that count: set it back to the prompt, so every step (eager, or a
            # graph replay) decodes the same token at the same position.
            for layer in cache.layers:
                layer.cumulative_length.fill_(prompt)
            return model(input_ids=step_ids, past_key_values=cache, cache_position=position, use_cache=True).logits

        cases.append((f"decode batch {batch} (KV cache {prompt})", batch, step, prefill))
    return cases


def time_case(forward, prefill, graphs: bool, iters: int) -> tuple[torch.Tensor, float]:
    """(logits, median ms per forward), eager or replaying a captured graph of one forward."""
    if prefill is not None:
        prefill()
    logits = forward().clone()
    if not graphs:
        return logits, batch_time(lambda _: forward(), 1, iters) * 1e3
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_logits = forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    replayed = static_logits.clone()
    ms = batch_time(lambda _: graph.replay(), 1, iters) * 1e3
    del graph
    return replayed, ms


def normwise(got: torch.Tensor, ref: torch.Tensor) -> float:
    num = den = 0.0
    for g, r in zip(got.reshape(-1, got.shape[-1]).split(512), ref.reshape(-1, ref.shape[-1]).split(512)):
        num += (g.float() - r.float()).pow(2).sum().item()
        den += r.float().pow(2).sum().item()
    return math.sqrt(num / max(den, 1e-30))


def model_benchmark(build_dir: Path, layers: int, iters: int, rounds: int) -> list[dict]:
    """Each case, eager and as a graph, on two models with the same weights, torch's and
    the kernelized one, timed in `rounds` interleaved rounds (the order alternating, the
    median kept): a host-bound eager decode step moves by a fifth between runs, and
    timing one model's cases after the other's put that drift into the ratio."""
    from kernelize_linear import kernelize_linears, linear_repository
    from kernels import Mode
    config = llama3_8b_config(layers)
    models = {}
    for label in ("torch", "kernelized"):
        models[label] = random_llama(config)
        if label == "kernelized":
            kernelize_linears(models[label], mode=Mode.INFERENCE, repository=linear_repository(build_dir))
    cases = {label: model_cases(model, config) for label, model in models.items()}
    rows = []
    for index, (name, tokens, _, _) in enumerate(cases["torch"]):
        row = {"case": name, "tokens": tokens}
        reference = None  # torch's eager logits: round 0 runs torch first
        for graphs in (False, True):
            mode = "graph" if graphs else "eager"
            times = {"torch": [], "kernelized": []}
            for r in range(rounds):
                for label in ("torch", "kernelized") if r % 2 == 0 else ("kernelized", "torch"):
                    if f"{label}_{mode}_error" in row:
                        continue
                    _, _, forward, prefill = cases[label][index]
                    try:
                        with torch.no_grad():
                            logits, ms = time_case(forward, prefill, graphs, iters)
                    except Exception as exc:  # noqa: BLE001 - a failed case is a result to report
                        row[f"{label}_{mode}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                        print(name, label, mode, "FAILED:", row[f"{label}_{mode}_error"], flush=True)
                        continue
                    times[label].append(ms)
                    if (label, mode) == ("torch", "eager"):
                        if reference is None:
                            reference = logits
                    elif reference is not None and f"{label}_{mode}_rel_error" not in row:
                        row[f"{label}_{mode}_rel_error"] = normwise(logits, reference)
                    del logits
            for label, ms in times.items():
                if ms:
                    row[f"{label}_{mode}_ms"] = statistics.median(ms)
                    print(name, label, mode, f"{row[f'{label}_{mode}_ms']:.3f} ms", flush=True)
        for mode in ("eager", "graph"):
            if f"torch_{mode}_ms" in row and f"kernelized_{mode}_ms" in row:
                row[f"{mode}_ratio"] = row[f"torch_{mode}_ms"] / row[f"kernelized_{mode}_ms"]
        rows.append(row)
        del reference  # a prefill's logits take GBs: free them before the next case runs
    del models, cases
    torch.cuda.empty_cache()
    return rows


def linear_weight_bytes(model) -> int:
    """The bytes of every nn.Linear weight of ``model``: what a decode step must read."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))


def skip_linears(model) -> None:
    """Make every nn.Linear of ``model`` return an uninitialised tensor of its output's
    shape: a forward then costs what everything but its Linear layers does."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = lambda x, features=m.out_features: x.new_empty(*x.shape[:-1], features)


def decode_bound(layers: int, iters: int, rounds: int, copy_gbs: float) -> dict[str, dict]:
    """Per decode case, what bounds any kernelized model in graph mode: torch's model
    with its Linear layers skipped (median ms of ``rounds`` rounds of captured
    forwards), plus the Linear weights' bytes at the copy bandwidth, the least a
    forward that reads them can take."""
    config = llama3_8b_config(layers)
    model = random_llama(config)
    weight_bytes = linear_weight_bytes(model)
    skip_linears(model)
    bounds = {}
    for name, _, forward, prefill in model_cases(model, config, prefills=()):
        with torch.no_grad():
            rest_ms = statistics.median(time_case(forward, prefill, True, iters)[1] for _ in range(rounds))
        bounds[name] = {"graph_ms_without_linears": rest_ms, "linear_weight_bytes": weight_bytes,
                        "linear_ms_at_copy_bandwidth": weight_bytes / (copy_gbs * 1e9) * 1e3}
    del model
    torch.cuda.empty_cache()
    return bounds


def decode_bound_lines(rows: list[dict], bounds: dict[str, dict]) -> list[str]:
    """A line per decode case with a bound: the graph ratio no kernelized model can beat."""
    lines = []
    for r in rows:
        b = bounds.get(r["case"])
        if b is None or "torch_graph_ms" not in r:
            continue
        least = b["graph_ms_without_linears"] + b["linear_ms_at_copy_bandwidth"]
        lines.append(f"- {r['case']}, graph: at most {r['torch_graph_ms'] / least:.3f}. Without its Linear layers "
                     f"torch's forward takes {b['graph_ms_without_linears']:.3f} ms; their weights "
                     f"({b['linear_weight_bytes'] / 1e9:.2f} GB) take {b['linear_ms_at_copy_bandwidth']:.3f} ms "
                     f"at the copy bandwidth.")
    return lines + ([""] if lines else [])


def model_markdown(rows: list[dict], layers: int, iters: int, rounds: int) -> list[str]:
    lines = [f"## Llama-3-8B-shaped model ({layers} layers, random weights), bf16", "",
             f"CUDA events, median of {iters} forwards (eager) or graph replays, the median of {rounds} rounds "
             "alternating the two models (the same weights); ratio: torch ms / kernelized ms; "
             "rel. error: kernelized logits against torch's eager logits (the graph row: replayed logits).", "",
             "| case | torch eager ms | kernelized eager ms | eager ratio | torch graph ms | kernelized graph ms "
             "| graph ratio | rel. error eager / graph (torch graph) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        def cell(key, fmt="{:.3f}"):
            return fmt.format(r[key]) if key in r else ("failed" if key.replace("_ms", "_error") in r else "n/a")
        lines.append(
            f"| {r['case']} | {cell('torch_eager_ms')} | {cell('kernelized_eager_ms')} | {cell('eager_ratio', '{:.2f}')} | "
            f"{cell('torch_graph_ms')} | {cell('kernelized_graph_ms')} | {cell('graph_ratio', '{:.2f}')} | "
            f"{cell('kernelized_eager_rel_error', '{:.1e}')} / {cell('kernelized_graph_rel_error', '{:.1e}')} "
            f"({cell('torch_graph_rel_error', '{:.1e}')}) |")
    failures = [f"- {r['case']}, {key.removesuffix('_error')}: {value}" for r in rows for key, value in r.items()
                if key.endswith("_error") and isinstance(value, str)]
    return lines + [""] + failures + ([""] if failures else [])


# ------------------------------------------------------------------------------ main


def parse_projection(text: str) -> tuple[str, tuple[int, int]]:
    """A projection of the shape set by name, or any other weight as NxK (its name)."""
    if text in PROJECTIONS:
        return text, PROJECTIONS[text]
    match = re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"unknown projection {text!r}; choose from {', '.join(PROJECTIONS)}, or give a weight as NxK")
    return text, (int(match[1]), int(match[2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("host", "shapes", "model"), default=["host", "shapes", "model"])
    parser.add_argument("--kernels", nargs="+", type=kernel_spec, default=["auto"],
                        help="kernel= values of pm.linear (default: auto); NAME:cluster_size=N runs "
                             "pm.matmul(x, w.t(), kernel=NAME, cluster_size=N)")
    parser.add_argument("--projections", nargs="+", type=parse_projection, default=list(PROJECTIONS.items()),
                        help="projections of the shape set by name, or weights as NxK (default: the shape set)")
    parser.add_argument("--ms", nargs="+", type=int, default=[*DECODE_M, *PREFILL_M], help="M values of the shape set")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds per case, shapes and model (median kept)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the model (default: %(default)s)")
    parser.add_argument("--iters", type=int, default=20, help="timed forwards per model case")
    parser.add_argument("--build", type=Path, default=ROOT / "build")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--tag", default="model-benchmark")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.iters < 1 or args.layers < 1 or min(args.ms) < 1:
        parser.error("--rounds, --iters, --layers and every --ms value must be >= 1")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU; none is present here")

    pm, how = load_kernel(args.build.resolve().parent)
    env = environment(pm, how)
    env["command"] = command_line()
    warm_up_gpu()
    report = {"environment": env}
    lines = ["# Real-model shapes: persistent_matmul against torch", "", *environment_lines(env), ""]
    if "host" in args.parts:
        report["host_floor"] = host_floor()
        report["host"] = host_cost(pm)
        lines += host_markdown(report["host"], report["host_floor"])
    if "shapes" in args.parts:
        env["copy_gbs"] = copy_bandwidth()
        rows = []
        for name, (n, k) in args.projections:
            rows += bench_projection(pm, name, n, k, tuple(args.ms), args.kernels, args.rounds)
        report["shapes"] = rows
        lines += shapes_markdown(rows, args.kernels, env["copy_gbs"])
    if "model" in args.parts:
        report["model"] = model_benchmark(args.build, args.layers, args.iters, args.rounds)
        lines += model_markdown(report["model"], args.layers, args.iters, args.rounds)
        if "copy_gbs" not in env:
            env["copy_gbs"] = copy_bandwidth()
        report["decode_bound"] = decode_bound(args.layers, args.iters, args.rounds, env["copy_gbs"])
        lines += decode_bound_lines(report["model"], report["decode_bound"])
    env["clocks_at_end"] = gpu_clocks()
    lines.append(f"Clocks at the end: {env['clocks_at_end']}")
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    md_path = result_path(args.out, args.tag, "md")
    md_path.write_text(text)
    md_path.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
