"""GPU tests of the skinny-product rungs (splitk, and wgmma_streamk on Hopper), of the C++
op entry's checks, and of every op inside CUDA graphs.

Run with ``python -m pytest -m gpu tests`` on a machine with a CUDA GPU.
"""

from __future__ import annotations

import secrets

import pytest
import torch

from matmul_checks import (DECODE_M, MODEL_PROJECTIONS, TOLERANCE, check_exact, check_graph_replays, exact_int_bias,
                           exact_int_operands, matmul_error, nan_count, poison, random_operands, signed_permutation)

pytestmark = pytest.mark.gpu

DEVICE = "cuda"


@pytest.fixture
def gen() -> torch.Generator:
    seed = secrets.randbits(63)
    print(f"random seed: {seed}")
    return torch.Generator(device=DEVICE).manual_seed(seed)


def runs(pm, kernel):
    info = pm.available_kernels()[kernel]
    if not info.available:
        pytest.skip(f"{kernel}: {info.reason}")


# The rungs for skinny products (decode shapes), both reading K-major weight rows.
SKINNY = ["splitk", "wgmma_streamk"]

# splitk: M across one token group (8), two (16), the 32- and 64-token blocks and the loop
# over blocks past 64; N across the 16-row CTA; K across a 64-element k-step, 8 warps'
# worth (512: every warp one step) and long K with a tail.
# wgmma_streamk: M across every token-tile width (8 ... 256) and several token tiles
# (257, 300); N across the 128-row tile; work that is less than one k-block per SM
# (1 x 1), whole tiles only (20000 x 64: 157 tiles of one k-block), stretches that
# cut tiles (20000 x 192), and on GPUs of 100-200 SMs the clustered cut. On 132 SMs:
# 128-row tiles in pairs (6144 x 4096: 48 tiles; 4096 rows from 257 tokens on) and in
# clusters of 3 where 40 of them are resident (5120 x 1024); 64-row tiles in pairs
# (4096 x 14336 and 4096 x 1000: 64 tiles, parts of 56 and of 4 k-blocks), in clusters of
# 5 (1536 x 2048: 24 tiles) and of 8 (1024 x 2048: 16 tiles, parts of 2 k-blocks).
SKINNY_M = [1, 2, 7, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 200, 256, 257, 300]
SKINNY_NK = [(1, 1), (15, 63), (16, 64), (17, 65), (48, 511), (33, 512), (130, 4104), (20000, 64), (20000, 192),
             (4096, 14336), (4096, 1000), (6144, 4096), (5120, 1024), (1536, 2048), (1024, 2048)]


@pytest.mark.parametrize("kernel", SKINNY)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_skinny_small_integers_with_bias_bit_exact(pm, gen, dtype, kernel):
    """linear on small-integer operands: every output exact, bias added once."""
    runs(pm, kernel)
    failures = []
    for m in SKINNY_M:
        for n, k in SKINNY_NK:
            x, w_t = exact_int_operands(m, n, k, dtype, DEVICE, b_transposed=True, generator=gen, headroom=1)
            bias = exact_int_bias(n, dtype, DEVICE, generator=gen)
            y = pm.linear(x, w_t.t(), bias, kernel=kernel)
            bad = check_exact(y, x, w_t, bias)
            if bad:
                failures.append(f"m={m} n={n} k={k}: {bad} of {m * n} elements differ")
    assert not failures, f"{failures} (seed {gen.initial_seed()})"


@pytest.mark.parametrize("kernel", SKINNY)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_skinny_decode_set_within_tolerance(pm, gen, dtype, kernel):
    """Every projection of the real-model shape set at M = 1, 16, 64 and 256: normwise
    error under the bound against fp64, every element written (matmul into a poisoned out)."""
    runs(pm, kernel)
    failures = []
    for name, (n, k) in MODEL_PROJECTIONS.items():
        for m in (1, 16, 64, 256):
            a, b = random_operands(m, n, k, dtype, DEVICE, b_transposed=True, generator=gen)
            out = poison(torch.empty(m, n, dtype=dtype, device=DEVICE))
            pm.matmul(a, b, kernel=kernel, out=out)
            err, nans = matmul_error(out, a, b), nan_count(out)
            if nans or not err < TOLERANCE[dtype]:
                failures.append(f"{name} m={m}: rel error {err:.3g}, {nans} NaN")
            del a, b, out
    assert not failures, f"{failures} (seed {gen.initial_seed()})"


@pytest.mark.parametrize("kernel", SKINNY)
def test_skinny_takes_any_layout(pm, gen, kernel):
    """Row-major b (copied K-major), transposed a, strided x with leading dims that do not
    collapse into one stride, an out with steps: all exact."""
    runs(pm, kernel)
    a, b = exact_int_operands(24, 300, 700, torch.bfloat16, DEVICE, a_transposed=True, generator=gen)
    buffer = poison(torch.empty(50, 900, dtype=torch.bfloat16, device=DEVICE))
    out = buffer[1::2, ::3][:24, :300]
    pm.matmul(a, b, kernel=kernel, out=out)
    assert check_exact(out, a, b) == 0
    x, w_t = exact_int_operands(12, 64, 256, torch.bfloat16, DEVICE, b_transposed=True, generator=gen)
    x3 = torch.empty(3, 8, 256, dtype=torch.bfloat16, device=DEVICE)[:, ::2]  # (3, 4, 256), rows 2 apart
    x3.copy_(x.reshape(3, 4, 256))
    y = pm.linear(x3, w_t.t(), kernel=kernel)
    assert y.shape == (3, 4, 64) and check_exact(y.reshape(12, 64), x, w_t) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_streamk_without_clusters_small_integers_bit_exact(pm, gen, dtype):
    """cluster_size=1: the stream-K cut over 128-row tiles, at the shapes that otherwise
    run the clustered cut (64- and 128-row tiles, clusters of 2 to 8), over every
    token-tile width: every output exact, bias added once."""
    runs(pm, "wgmma_streamk")
    failures = []
    for m in [1, 9, 17, 33, 65, 128, 129, 257]:
        for n, k in [(4096, 14336), (4096, 1000), (6144, 4096), (5120, 1024), (1536, 2048), (1024, 2048)]:
            x, w_t = exact_int_operands(m, n, k, dtype, DEVICE, b_transposed=True, generator=gen, headroom=1)
            bias = exact_int_bias(n, dtype, DEVICE, generator=gen)
            y = pm.matmul(x, w_t, bias=bias, kernel="wgmma_streamk", cluster_size=1)
            bad = check_exact(y, x, w_t, bias)
            if bad:
                failures.append(f"m={m} n={n} k={k}: {bad} of {m * n} elements differ")
    assert not failures, f"{failures} (seed {gen.initial_seed()})"


def test_streamk_bit_exact_shapes_cover_every_cut(pm):
    """The shapes of the bit-exact test run wgmma_streamk's stream-K cut and its clustered
    cut over 128-row tiles whole and in pairs, and over 64-row tiles in pairs and in larger
    clusters on this GPU (tile_config says which), so that test checks each of them; 4096
    weight rows run clustered at every token count up to 256, every CTA one tile's part."""
    runs(pm, "wgmma_streamk")
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    if not 100 <= sms <= 200:
        pytest.skip(f"the shapes are chosen for 100-200 SMs, this GPU has {sms}")
    cuts = set()
    for m in SKINNY_M:
        for n, k in SKINNY_NK:
            config = pm.tile_config(m, n, kernel="wgmma_streamk", k=k)
            cuts.add((config["block_n"], config["cluster_size"]))
            if config["block_n"] == 64:  # 64-row tiles run only in the clustered cut, in clusters
                assert config["cluster_size"] >= 2, (m, n, k, config)
    assert {(128, 1), (128, 2), (64, 2)} <= cuts, cuts
    assert any(rows == 64 and cluster > 2 for rows, cluster in cuts), cuts
    for m in (1, 64, 256):
        config = pm.tile_config(m, 4096, kernel="wgmma_streamk", k=4096)
        assert config["cluster_size"] > 1 and config["tiles"] == 4096 // config["block_n"], config
        assert config["persistent_ctas"] == config["cluster_size"] * config["tiles"] <= sms, config
    if sms == 132:  # H100 SXM, H200: 64 tiles of 64 rows in pairs, cuBLAS's grid at these shapes
        assert (config["block_n"], config["cluster_size"], config["persistent_ctas"]) == (64, 2, 128), config


def test_streamk_is_deterministic_and_leaves_its_counters_zero(pm, gen):
    """The same product twice, and after products of other shapes on the same stream (whose
    tiles use the same counters and slots): bit for bit the same result. A counter left
    non-zero, or a part added twice or not at all, would change it."""
    runs(pm, "wgmma_streamk")
    a, b = random_operands(16, 4096, 14336, torch.bfloat16, DEVICE, b_transposed=True, generator=gen)
    first = pm.matmul(a, b, kernel="wgmma_streamk")
    for m, n, k in [(1, 6144, 4096), (200, 4096, 4104), (64, 20000, 192)]:
        x, w = random_operands(m, n, k, torch.bfloat16, DEVICE, b_transposed=True, generator=gen)
        pm.matmul(x, w, kernel="wgmma_streamk")
    assert torch.equal(pm.matmul(a, b, kernel="wgmma_streamk"), first)
    assert matmul_error(first, a, b) < TOLERANCE[torch.bfloat16]


# splitk's bulk kernel on Hopper (1 and 8 tokens) and its register kernel (16 to 48).
@pytest.mark.parametrize("m", [1, 8, 16, 32, 48])
@pytest.mark.parametrize("k", [4096, 1000])
def test_splitk_chained_calls_wait_for_each_other(pm, m, k):
    """On compute capability 9.0 and newer a splitk launch may start while the kernel
    before it in the stream still runs (a programmatic dependent launch, csrc/splitk.cu)
    and must touch global memory only once that kernel is done. A chain queued back to
    back on one stream, each product reading the previous one's output as its tokens
    (read after write) and overwriting the buffer the previous one read (write after
    read), its weights copied into one buffer just before it (read after another
    kernel's write), checked exactly at the end: x w1^T w2^T ... with signed
    permutations w (K = 1000: a k-step that ends inside K)."""
    runs(pm, "splitk")
    x = torch.randint(-8, 9, (m, k), device=DEVICE).to(torch.bfloat16)
    buffers = [x.clone(), poison(torch.empty(m, k, dtype=torch.bfloat16, device=DEVICE))]
    ws = [signed_permutation(k).to(torch.bfloat16) for _ in range(6)]
    weight = torch.empty(k, k, dtype=torch.bfloat16, device=DEVICE)
    for i, w in enumerate(ws):
        weight.copy_(w)
        pm.matmul(buffers[i % 2], weight.t(), kernel="splitk", out=buffers[(i + 1) % 2])
    expected = x.double()
    for w in ws:
        expected = expected @ w.double().t()
    torch.cuda.synchronize()
    got = buffers[len(ws) % 2].double()
    assert int((got != expected).sum()) == 0, "a call read or overwrote memory before the call before it was done"


def test_auto_takes_the_skinny_rungs_where_choose_kernel_says(pm, gen):
    """kernel="auto" runs what the op entry's choice names: the skinny rung's result bit
    for bit (deterministic) at decode shapes, the tile rung's where no skinny rung is chosen."""
    props = torch.cuda.get_device_properties(0)
    choose = pm._matmul.ops.choose_kernel
    hopper_132 = (props.major, props.minor, props.multi_processor_count) == (9, 0, 132)
    # On an H100 or H200 (132 SMs): 8192 weight rows (64 tiles) run wgmma_streamk's clustered
    # cut in pairs, up to 64 tokens but for splitk's bulk kernel at up to 8 tokens against
    # short rows; 20000 x 4096 is 80 M elements; 1024 rows (16 tiles of 64) run clusters of 8
    # from one token on (splitk's 64 CTAs fill too few SMs) up to 128, 640 rows (10 tiles) fill
    # too few SMs; 4096 rows run 64-row pairs up to 128 tokens, 6144 rows' 128-row pairs to 64.
    expected = {(4, 8192, 1024): "splitk", (16, 8192, 1024): "wgmma_streamk", (32, 8192, 1024): "wgmma_streamk",
                (64, 8192, 1024): "wgmma_streamk", (300, 8192, 1024): "wgmma_persistent",
                (8, 20000, 4096): "splitk", (16, 20000, 4096): "wgmma_streamk", (1, 10000, 8192): "wgmma_streamk",
                (48, 1024, 14336): "wgmma_streamk", (48, 640, 14336): "wgmma_persistent",
                (1, 1024, 4096): "wgmma_streamk", (128, 1024, 4096): "wgmma_streamk",
                (128, 4096, 4096): "wgmma_streamk", (96, 6144, 4096): "wgmma_persistent"}
    for (m, n, k), rung_here in expected.items():
        rung = choose(props.major, props.minor, props.multi_processor_count, torch.bfloat16, m, n, k, True)
        a, b = random_operands(m, n, k, torch.bfloat16, DEVICE, b_transposed=True, generator=gen)
        assert torch.equal(pm.matmul(a, b), pm.matmul(a, b, kernel=rung)), (m, n, k, rung)
        if hopper_132:
            assert rung == rung_here, (m, n, k, rung)


# --------------------------------------------------------------------------- the op entry's own checks


def test_ops_called_directly_reject_bad_cuda_arguments(pm):
    """The C++ checks themselves, without the Python explanation: each names the argument."""
    ops = pm._matmul.ops
    x = torch.randn(4, 64, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(32, 64, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="x must be float32, float16 or bfloat16"):
        ops.linear_fwd(x.double(), w, None, "auto")
    with pytest.raises(RuntimeError, match="weight and x must have the same dtype"):
        ops.linear_fwd(x, w.half(), None, "auto")
    with pytest.raises(RuntimeError, match="x has 64 features in its last dim but weight is 32x65"):
        ops.linear_fwd(x, torch.randn(32, 65, device=DEVICE, dtype=torch.bfloat16), None, "auto")
    with pytest.raises(RuntimeError, match="bias has 31 elements, expected 32"):
        ops.linear_fwd(x, w, torch.randn(31, device=DEVICE, dtype=torch.bfloat16), "auto")
    with pytest.raises(RuntimeError, match="unknown kernel 'fast'; choose one of: auto, naive"):
        ops.linear_fwd(x, w, None, "fast")
    with pytest.raises(RuntimeError, match="kernel 'warptiled' does not take this dtype"):
        ops.matmul(x, w.t(), "warptiled")
    square = torch.randn(64, 64, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="out overlaps an input"):
        ops.matmul_out(square, square, None, square, "auto")
    with pytest.raises(RuntimeError, match="out has overlapping elements"):
        ops.matmul_out(x, w.t(), None, torch.empty(1, 32, device=DEVICE, dtype=torch.bfloat16).expand(4, 32), "auto")
    with pytest.raises(RuntimeError, match="out must be 4x32"):
        ops.matmul_out(x, w.t(), None, torch.empty(4, 31, device=DEVICE, dtype=torch.bfloat16), "auto")
    with pytest.raises(RuntimeError, match="'splitk' has no instrumented build"):
        ops.matmul_out(x, w.t(), None, torch.empty(4, 32, device=DEVICE, dtype=torch.bfloat16), "splitk", -1, 0,
                       torch.empty(1, 6, device=DEVICE, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="tile_order must be -1"):
        ops.matmul_out(x, w.t(), None, torch.empty(4, 32, device=DEVICE, dtype=torch.bfloat16), "persistent", 7)
    if pm.available_kernels()["wgmma_streamk"].available:
        with pytest.raises(RuntimeError, match="kernel 'wgmma_streamk' takes cluster_size 1"):
            ops.matmul_out(x, w.t(), None, torch.empty(4, 32, device=DEVICE, dtype=torch.bfloat16), "wgmma_streamk",
                           -1, 2)


def test_python_errors_name_the_argument_for_cuda_tensors(pm):
    """Through pm.linear / pm.matmul the op's error is replaced by the exact one."""
    x = torch.randn(4, 64, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(32, 64, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^x has dtype torch\.float64; supported dtypes"):
        pm.linear(x.double(), w)
    with pytest.raises(ValueError, match=r"^x has 64 features in its last dim but weight is 32x65"):
        pm.linear(x, torch.randn(32, 65, device=DEVICE, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"^kernel 'warptiled' does not take torch\.bfloat16"):
        pm.matmul(x, w.t(), kernel="warptiled")
    with pytest.raises(TypeError, match=r"^kernel must be a str"):
        pm.linear(x, w, kernel=3)


def test_layer_falls_back_to_torch_for_what_the_op_does_not_take(pm):
    """MatmulLinear on float64 CUDA tensors: F.linear's result, not an error."""
    layer = torch.nn.Linear(64, 32, device=DEVICE, dtype=torch.float64)
    expected = layer(torch.ones(3, 64, device=DEVICE, dtype=torch.float64))
    layer.forward = pm.layers.MatmulLinear.forward.__get__(layer)
    assert torch.equal(layer(torch.ones(3, 64, device=DEVICE, dtype=torch.float64)), expected)


# --------------------------------------------------------------------------- CUDA graphs


@pytest.mark.parametrize("kernel", ["naive", "tiled", "persistent", "wgmma", "wgmma_persistent", "splitk",
                                    "wgmma_streamk", "auto"])
@pytest.mark.parametrize("shape", [(16, 10240, 1024), (64, 4096, 1024), (1000, 3000, 320)],
                         ids=["decode", "decode-clustered", "ragged"])
def test_every_rung_replays_in_a_cuda_graph(pm, kernel, shape):
    """matmul captured into a CUDA graph (the split-tail workspace of the persistent rungs
    included), replayed with new inputs between eager calls: every replay exact."""
    if kernel != "auto":
        runs(pm, kernel)
    m, n, k = shape
    check_graph_replays(lambda a, b, out: pm.matmul(a, b, kernel=kernel, out=out), m, n, k,
                        f"{kernel}: wrong result after replay")


def test_linear_and_a_model_forward_replay_in_a_cuda_graph(pm):
    """linear (allocating its output inside the graph) and a two-layer MLP of
    MatmulLinear layers at decode and prefill sizes: the replayed outputs equal the eager ones."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 4608), torch.nn.SiLU(), torch.nn.Linear(4608, 512))
    model = model.to(DEVICE, torch.bfloat16)
    for layer in (model[0], model[2]):
        layer.forward = pm.layers.MatmulLinear.forward.__get__(layer)
    for tokens in (1, 16, 300):
        static_x = torch.randn(tokens, 512, device=DEVICE, dtype=torch.bfloat16)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            model(static_x)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                static_y = model(static_x)
        torch.cuda.current_stream().wait_stream(stream)
        for _ in range(2):
            static_x.copy_(torch.randn_like(static_x))
            graph.replay()
            with torch.no_grad():
                eager = model(static_x)
            torch.cuda.synchronize()
            assert torch.equal(static_y, eager), f"{tokens} tokens: replayed output differs"
