"""CPU tests of the device scripts, for what needs no GPU: the benchmark's columns,
compare_builds' refusal of a comparison that would measure nothing, and that the
shell scripts parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from benchmark_table import with_variant_columns  # noqa: E402
from matmul_checks import CLUSTER_VARIANT, TILE_ORDER_VARIANTS  # noqa: E402


def test_variant_columns_follow_each_persistent_rung():
    rungs = ["tiled", "persistent", "wgmma", "wgmma_persistent"]
    expected = ["tiled", "persistent", *(f"persistent-{o}" for o in TILE_ORDER_VARIANTS), "wgmma",
                "wgmma_persistent", *(f"wgmma_persistent-{o}" for o in TILE_ORDER_VARIANTS),
                f"wgmma_persistent-{CLUSTER_VARIANT}"]
    assert with_variant_columns(rungs) == expected


def test_no_variants_keeps_just_the_rungs():
    rungs = ["naive", "persistent", "wgmma_persistent"]
    assert with_variant_columns(rungs, variants=False) == rungs


def _compare_builds(repo_root, env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "compare_builds.py"), *args], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_compare_builds_refuses_one_build_against_itself(variant_dir, repo_root, subprocess_env):
    build = str(variant_dir.parent)
    result = _compare_builds(repo_root, subprocess_env, build, "--candidates", build)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "hold the same build" in result.stderr


def test_compare_builds_needs_a_round(repo_root, subprocess_env):
    result = _compare_builds(repo_root, subprocess_env, "build", "--rounds", "0")
    assert result.returncode == 2
    assert "--rounds must be at least 1" in result.stderr


def test_device_shell_scripts_parse():
    """`bash -n` on the scripts meant for the GPU machine: a syntax error would only show there."""
    scripts = sorted(SCRIPTS.glob("*.sh"))
    assert scripts
    for script in scripts:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


def test_compare_builds_names_a_folder_without_a_build(repo_root, subprocess_env, tmp_path):
    result = _compare_builds(repo_root, subprocess_env, str(tmp_path), "--candidates", "build")
    assert result.returncode == 2
    assert f"{tmp_path} holds no build" in result.stderr


def test_compare_builds_names_a_bad_dtype(variant_dir, repo_root, subprocess_env):
    build = str(variant_dir.parent)
    result = _compare_builds(repo_root, subprocess_env, build, "--candidates", build, "--dtype", "bfloat17")
    assert result.returncode == 2
    assert "'bfloat17' is not a torch dtype" in result.stderr


def test_compare_builds_refuses_a_baseline_rung_among_the_rungs(variant_dir, repo_root, subprocess_env):
    build = str(variant_dir.parent)
    result = _compare_builds(repo_root, subprocess_env, build, "--candidates", build, "--baseline-rung", "tiled",
                             "--rungs", "tiled", "persistent")
    assert result.returncode == 2
    assert "--baseline-rung tiled is also among --rungs" in result.stderr


def test_compare_builds_takes_two_rungs_of_one_build(variant_dir, repo_root, subprocess_env):
    """With --baseline-rung the same folder may be baseline and candidate: the
    refusal of one build against itself no longer applies (without a GPU the
    script then stops where it first needs one)."""
    build = str(variant_dir.parent)
    result = _compare_builds(repo_root, subprocess_env, build, "--candidates", build, "--baseline-rung", "tiled",
                             "--rungs", "persistent")
    assert "hold the same build" not in result.stderr
    assert "is also among --rungs" not in result.stderr


def test_geomean():
    from compare_builds import geomean

    assert abs(geomean([1.0, 4.0]) - 2.0) < 1e-12
    assert abs(geomean([0.5, 2.0, 1.0]) - 1.0) < 1e-12


def test_sustained_run_refuses_no_time(repo_root, subprocess_env):
    result = subprocess.run([sys.executable, str(SCRIPTS / "sustained_run.py"), "--seconds", "0"], cwd=repo_root,
                            env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "--seconds must be positive" in result.stderr


def test_speed_of_light_columns_hand_out_every_k_block():
    """Each k-loop column runs the product's k-blocks once over: whole tiles per CTA
    as wgmma_persistent balances them, or spread so no CTA has two more than another."""
    from speed_of_light import BK, BM, BN, k_loop_columns

    class Recorder:
        def launch(self, ctas, base, extra, extra_ctas, tile_kblocks):
            self.split = (ctas, base, extra, extra_ctas, tile_kblocks)

    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 1024), (3000, 3000, 3000), (4097, 11008, 4097)]:
        tiles, tile_kb = -(-m // BM) * -(-n // BN), -(-k // BK)
        recorder = Recorder()
        columns = k_loop_columns(recorder, m, n, k, [132, 120], 132)
        assert list(columns) == ["k-loop tiles@132", "k-loop even@132", "k-loop even@120"]
        for name, fn in columns.items():
            fn(0)
            ctas, base, extra, extra_ctas, kb = recorder.split
            per_cta = [base + (extra if c < extra_ctas else 0) for c in range(ctas)]
            assert kb == tile_kb and sum(per_cta) == tiles * tile_kb, name
            if "tiles" in name:
                assert all(blocks % tile_kb == 0 for blocks in per_cta), name
                assert max(per_cta) - min(per_cta) <= tile_kb
            else:
                assert max(per_cta) - min(per_cta) <= 1, name


def test_speed_of_light_kernel_compiles_to_hgmma(tmp_path):
    """The k-loop compiles for sm_90a with the package's helpers, and keeps all its
    wgmmas (a k-loop whose accumulators went unused would lose them)."""
    from speed_of_light import compile_cubin

    from kernelpress.check import find_cuobjdump

    cubin = compile_cubin(tmp_path)
    sass = subprocess.run([str(find_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    for kernel in ("wgmma_k_loop_b_kmajor", "wgmma_k_loop_b_nmajor"):
        body = sass.split(f"Function : {kernel}")[1].split("Function :")[0]
        assert body.count("HGMMA.64x256x16.F32.BF16") >= 4, kernel


def test_speed_of_light_table_shows_clock_and_power_only_where_sampled():
    from speed_of_light import markdown

    rows = [{"shape": "64x64x64", "column": "k-loop even@132", "timing": "benchmark", "us": 10.0, "tflops": 0.05,
             "ratio": 1.25, "spread": 0.02},
            {"shape": "64x64x64", "column": "torch.matmul", "timing": "sustained", "us": 12.5, "tflops": 0.04,
             "ratio": 1.0, "sm_clock_mhz": 1500.4, "power_w": 690.2}]
    lines = markdown(rows).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| 64x64x64 | k-loop even@132 | benchmark | 10.0 | 0 | 1.250 | 2.0% |  |  |"
    assert lines[3] == "| 64x64x64 | torch.matmul | sustained | 12.5 | 0 | 1.000 |  | 1500 | 690 |"


def test_interleaved_times_times_every_column_once_a_round_in_a_seeded_order(monkeypatch):
    """The benchmark, compare_builds and speed_of_light share this loop: each round
    times every column once, in an order shuffled per round but the same from run
    to run, and each column's times are its own."""
    import benchmark_table

    timed = []
    monkeypatch.setattr(benchmark_table, "time_per_call",
                        lambda fn, calls, batches: timed.append((fn(0), calls, batches)) or fn(0) * 10 + calls)
    runners = {name: (lambda v: lambda i: v)(v) for v, name in enumerate(["torch.matmul", "tiled", "wgmma", "k-loop"])}
    calls = {"torch.matmul": 1, "tiled": 2, "wgmma": 3, "k-loop": 4}
    times = benchmark_table.interleaved_times(runners, calls, dict.fromkeys(runners, 2), rounds=3)
    assert times == {name: [v * 10 + calls[name]] * 3 for v, name in enumerate(runners)}
    assert len(timed) == 12 and all(batches == 2 for _, _, batches in timed)
    orders = [[v for v, _, _ in timed[r * 4:(r + 1) * 4]] for r in range(3)]
    assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
    assert len({tuple(order) for order in orders}) > 1  # shuffled per round
    timed.clear()
    benchmark_table.interleaved_times(runners, calls, dict.fromkeys(runners, 2), rounds=3)
    assert [[v for v, _, _ in timed[r * 4:(r + 1) * 4]] for r in range(3)] == orders  # the same every run


def _speed_of_light(repo_root, env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "speed_of_light.py"), *args], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_speed_of_light_names_bad_arguments(repo_root, subprocess_env, tmp_path):
    cases = [(["--rounds", "0"], "--rounds and every --ctas must be at least 1"),
             (["--ctas", "0"], "--rounds and every --ctas must be at least 1"),
             (["--builds", str(tmp_path)], "holds no build"),
             (["--builds", "build", "--no-kernel"], "--builds and --no-kernel exclude each other")]
    for args, message in cases:
        result = _speed_of_light(repo_root, subprocess_env, *args)
        assert result.returncode == 2, (args, result.stderr[-2000:])
        assert message in result.stderr, (args, result.stderr[-2000:])


def test_speed_of_light_says_it_needs_a_hopper_gpu(repo_root, subprocess_env):
    """On a machine without an sm_90 GPU (CI's), a clear refusal rather than a driver error."""
    import torch

    if torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0):
        import pytest
        pytest.skip("this machine has the GPU the script needs")
    result = _speed_of_light(repo_root, subprocess_env, "--no-kernel")
    assert result.returncode == 2
    assert "needs a compute capability 9.0 GPU" in result.stderr


def test_sustained_columns_warm_each_column_and_take_ratios_to_torch(monkeypatch):
    """sustained_run.py and speed_of_light.py share this loop: 20 warm calls per
    column, then its sampled run; ratios are torch.matmul's time over the column's."""
    import sustained_run

    calls = []
    monkeypatch.setattr(sustained_run.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(sustained_run, "sampled", lambda fn, seconds: (fn(-1), 1500.0, 690.0, 10))
    columns = {"torch.matmul": lambda i: calls.append(("torch", i)) or 2.0,
               "k-loop": lambda i: calls.append(("k-loop", i)) or 1.0}
    rows = list(sustained_run.sustained_columns(columns, 3.0))
    assert rows == [("torch.matmul", 2.0, 1500.0, 690.0, 1.0), ("k-loop", 1.0, 1500.0, 690.0, 2.0)]
    assert calls == [("torch", i) for i in range(20)] + [("torch", -1)] + \
        [("k-loop", i) for i in range(20)] + [("k-loop", -1)]
