"""CPU tests of the device scripts, for what needs no GPU: the benchmark's columns
and the README table it writes, compare_builds' refusal of a comparison that
would measure nothing, the one timing loop, the names of the results files, the
correctness sweep's compact summary, and that the shell scripts parse."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from benchmark_table import README_END, README_START, with_variant_columns
from harness.kernel import CLUSTER_VARIANT, TILE_ORDER_VARIANTS

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


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
    """`bash -n` on the scripts meant for the GPU machine: a syntax error there costs a run on it."""
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
    from harness.timing import geomean

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
    """The k-loop compiles for sm_90a with the package's device functions, and keeps all its
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
    from harness import timing

    timed = []
    monkeypatch.setattr(timing, "time_per_call",
                        lambda fn, calls, batches: timed.append((fn(0), calls, batches)) or fn(0) * 10 + calls)
    runners = {name: (lambda v: lambda i: v)(v) for v, name in enumerate(["torch.matmul", "tiled", "wgmma", "k-loop"])}
    calls = {"torch.matmul": 1, "tiled": 2, "wgmma": 3, "k-loop": 4}
    times = timing.interleaved_times(runners, calls, dict.fromkeys(runners, 2), rounds=3)
    assert times == {name: [v * 10 + calls[name]] * 3 for v, name in enumerate(runners)}
    assert len(timed) == 12 and all(batches == 2 for _, _, batches in timed)
    orders = [[v for v, _, _ in timed[r * 4:(r + 1) * 4]] for r in range(3)]
    assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
    assert len({tuple(order) for order in orders}) > 1  # shuffled per round
    timed.clear()
    timing.interleaved_times(runners, calls, dict.fromkeys(runners, 2), rounds=3)
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


# --- one timing loop -----------------------------------------------------------------


def _function(path: Path, name: str) -> ast.FunctionDef:
    return next(node for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.FunctionDef) and node.name == name)


def _without_docstring(fn: ast.FunctionDef) -> str:
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    return ast.dump(ast.Module(body=body, type_ignores=[])) + ast.dump(fn.args)


def test_space_times_with_the_scripts_loop():
    """The Space is uploaded without scripts/, so it keeps its own copy of the timing
    loop: it must stay the scripts' loop statement for statement (arguments and
    body; docstrings aside), or the page and the tables would measure differently."""
    scripts_loop = _function(SCRIPTS / "harness" / "timing.py", "batch_time")
    space_loop = _function(REPO / "space" / "gpu_work.py", "_time_per_call")
    assert _without_docstring(space_loop) == _without_docstring(scripts_loop)
    other = _function(SCRIPTS / "harness" / "timing.py", "time_per_call")  # a different function: must differ
    assert _without_docstring(other) != _without_docstring(scripts_loop)


def test_no_script_reaches_into_tests():
    """The scripts import their shared code from scripts/harness/: none imports the
    tests' module or puts tests/ on its path."""
    for script in [*SCRIPTS.glob("*.py"), *SCRIPTS.glob("harness/*.py"), REPO / "space" / "record.py"]:
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "matmul_checks", script.name
            elif isinstance(node, ast.Import):
                assert "matmul_checks" not in [a.name for a in node.names], script.name
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.path.insert":
                assert "tests" not in ast.unparse(node), f"{script.name}: {ast.unparse(node)}"


# --- the results files -----------------------------------------------------------------


def test_latest_result_is_the_greatest_date_of_exactly_that_kind(tmp_path):
    from harness.results import latest_result, result_path

    assert latest_result(tmp_path / "missing", "benchmark") is None
    for name in ("2026-01-02-benchmark.md", "2026-01-10-benchmark.md", "2026-01-03-benchmark.md",
                 "2026-02-01-benchmark.json", "2026-03-01-model-benchmark.md", "2026-03-01-benchmark-fp32.md",
                 "2026-04-01-correctness-splitk.md", "2026-01-05-correctness.md", "notes-benchmark.md"):
        (tmp_path / name).write_text("")
    assert latest_result(tmp_path, "benchmark").name == "2026-01-10-benchmark.md"
    assert latest_result(tmp_path, "benchmark", "json").name == "2026-02-01-benchmark.json"
    assert latest_result(tmp_path, "model-benchmark").name == "2026-03-01-model-benchmark.md"
    assert latest_result(tmp_path, "correctness").name == "2026-01-05-correctness.md"
    assert latest_result(tmp_path, "correctness-splitk").name == "2026-04-01-correctness-splitk.md"
    assert latest_result(tmp_path, "demo") is None
    import datetime

    assert result_path(tmp_path, "demo", "md", datetime.date(2026, 7, 8)) == tmp_path / "2026-07-08-demo.md"


def test_committed_results_follow_the_name_scheme():
    """benchmarks/results/ holds the README and YYYY-MM-DD-<kind>.<ext> files only, few
    and small (older runs live in git history), and its README names every kind there."""
    import re

    results = REPO / "benchmarks" / "results"
    files = sorted(p for p in results.iterdir() if p.is_file())
    assert len(files) <= 20 and sum(p.stat().st_size for p in files) < 3 * 2**20
    readme = (results / "README.md").read_text()
    for path in files:
        if path.name == "README.md":
            continue
        match = re.fullmatch(r"\d{4}-\d{2}-\d{2}-([a-z0-9-]+)\.(md|json|png|log)", path.name)
        assert match, path.name
        assert f"-{match.group(1)}." in readme, f"benchmarks/results/README.md does not name {path.name}'s kind"


def test_demo_shows_the_newest_all_rung_correctness_and_demo(tmp_path):
    import demo

    for name in ("2026-01-01-correctness.md", "2026-01-03-correctness.md", "2026-01-09-correctness-splitk.md",
                 "2026-01-09-correctness-quick.md", "2026-01-02-demo.md", "2026-01-04-benchmark.md"):
        (tmp_path / name).write_text("- GPU: Some GPU\n")
    assert [p.name for p in demo.recorded_files(tmp_path)] == ["2026-01-03-correctness.md", "2026-01-02-demo.md"]


def test_demo_without_a_gpu_prints_the_recorded_results(repo_root, subprocess_env):
    import torch

    if torch.cuda.is_available():
        import pytest
        pytest.skip("with a GPU the demo measures instead")
    from harness.results import RESULTS_DIR, latest_result

    result = subprocess.run([sys.executable, str(SCRIPTS / "demo.py")], cwd=repo_root, env=subprocess_env,
                            capture_output=True, text=True, timeout=300)
    correctness = latest_result(RESULTS_DIR, "correctness")
    assert correctness is not None
    assert f"----- benchmarks/results/{correctness.name} -----" in result.stdout
    assert "No CUDA GPU here: showing results recorded on" in result.stdout


# --- the README's results table ----------------------------------------------------------

FIXTURE = REPO / "tests" / "fixtures" / "benchmark-result.json"


def _readme_from_json(repo_root, env, readme: Path, result_json: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "benchmark_table.py"), "--from-json", str(result_json),
                           "--readme", str(readme)], cwd=repo_root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_benchmark_writes_its_table_between_the_readme_markers(tmp_path, repo_root, subprocess_env):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    recorded = results / "2026-12-03-benchmark.json"
    recorded.write_text(FIXTURE.read_text())
    (results / "2026-12-03-benchmark.png").write_bytes(b"\x89PNG")
    before = "# A project\n\nIntro line.\n\n## Results\n\n"
    after = "\nMore text.\n\n## Next\n\nThe end.\n"
    readme = tmp_path / "README.md"
    readme.write_text(f"{before}{README_START}\nan old table\n| 1 | 2 |\n{README_END}{after}")

    result = _readme_from_json(repo_root, subprocess_env, readme, recorded)
    assert result.returncode == 0, result.stderr[-2000:]
    text = readme.read_text()
    assert text.startswith(before + README_START + "\n") and text.endswith(README_END + after)
    table = text[len(before) + len(README_START):-len(README_END + after)].strip("\n").splitlines()
    assert "an old table" not in text
    assert table[0].startswith("Measured on NVIDIA H200 (132 SMs) on 2026-12-03 (torch 2.11.0+cu130, driver "
                               "580.159.04) at commit `20c7419be36e` with "
                               "`python scripts/benchmark_table.py --no-variants --rounds 9 --shapes ")
    assert "[2026-12-03-benchmark.md](benchmarks/results/2026-12-03-benchmark.md)" in table[0]
    assert table[2:] == [
        "| bfloat16 M x N x K | torch.matmul | naive | tiled | persistent | wgmma | wgmma_persistent |",
        "|---|---:|---:|---:|---:|---:|---:|",
        "| 4096x4096x4096 | 783.4 | 4.3 (0.01x) | 457.3 (0.58x) | 466.9 (0.60x) | 747.9 (0.95x) | 768.9 (0.98x) |",
        "| 8192x8192x8192 | 720.9 | skipped | 398.8 (0.55x) | 407.0 (0.56x) | 710.6 (0.99x) | 741.5 (1.03x) |",
        "| 4097x4097x4097 | 132.2 | 3.2 (0.02x) | 197.9 (1.50x) | 213.3 (1.61x) | 426.1 (3.22x) | 432.0 (3.27x) |",
        "| geomean ratio | | 0.01x | 0.78x | 0.82x | 1.45x | 1.49x |",
        "",
        "float32 (TF32 off), geomean ratio to torch.matmul over 1 shapes: naive 0.08x, warptiled 0.89x.",
        "",
        "![TFLOP/s per shape and rung](benchmarks/results/2026-12-03-benchmark.png)",
    ]
    # Again: the same README, the same table (the block replaces itself, nothing piles up).
    assert _readme_from_json(repo_root, subprocess_env, readme, recorded).returncode == 0
    assert readme.read_text() == text


def test_benchmark_records_its_command_for_the_readme():
    from benchmark_table import recorded_command

    result = json.loads(FIXTURE.read_text())
    result["environment"]["command"] = "python scripts/benchmark_table.py --rounds 5"
    assert recorded_command(result) == "python scripts/benchmark_table.py --rounds 5"


def test_benchmark_leaves_a_readme_without_markers_alone(tmp_path, repo_root, subprocess_env):
    readme = tmp_path / "README.md"
    readme.write_text(f"# A project\n\n{README_START}\nno end marker\n")
    result = _readme_from_json(repo_root, subprocess_env, readme, FIXTURE)
    assert result.returncode == 1
    assert "README table not written" in result.stderr and README_END in result.stderr
    assert readme.read_text() == f"# A project\n\n{README_START}\nno end marker\n"


def test_the_recorded_benchmark_of_record_renders():
    """The committed run of record stays readable by the README writer."""
    from benchmark_table import readme_table
    from harness.results import RESULTS_DIR, latest_result

    recorded = latest_result(RESULTS_DIR, "benchmark", "json")
    assert recorded is not None
    result = json.loads(recorded.read_text())
    block = readme_table(result, recorded, REPO / "README.md")
    assert result["environment"]["gpu"] in block and result["environment"]["git_commit"][:12] in block
    assert f"(benchmarks/results/{recorded.with_suffix('.md').name})" in block


# --- the correctness sweep's summary ------------------------------------------------------


def test_sweep_result_kind_names_the_rungs_in_the_name_scheme():
    """The sweep's kind is what benchmarks/results/ takes: rung names' underscores become hyphens."""
    import correctness_sweep as sweep

    assert sweep.result_kind([], False) == "correctness"
    assert sweep.result_kind([], True) == "correctness-quick"
    assert sweep.result_kind(["splitk", "wgmma_streamk"], False) == "correctness-splitk-wgmma-streamk"
    assert sweep.result_kind(["wgmma_persistent"], True) == "correctness-quick-wgmma-persistent"


def test_correctness_summary_is_compact_and_cases_only_on_request(tmp_path):
    import correctness_sweep as sweep

    cases = [sweep.Case("tiled", "bf16", "random", m, 64, 64, False, False, bound=1e-2, rel_error=1e-3,
                        nan_count=0, passed=True, status="pass") for m in range(1, 3001)]
    cases.append(sweep.Case("tiled", "bf16", "exact", 7, 9, 5, True, False, mismatches=3, nan_count=0,
                            passed=False, status="fail"))
    cases.append(sweep.Case("tiled", "bf16", "random", 8, 8, 8, False, True, bound=1e-2, rel_error=0.5,
                            nan_count=1, passed=False, status="fail", fuzz=True))
    rows = sweep.summarize(cases)
    report = {"verdict": "FAIL", "stopped_early": None, "rungs": ["tiled"], "quick": False, "seed": 1,
              "reproduce": "python scripts/correctness_sweep.py --seed 1", "environment": {"gpu": "Some GPU"},
              "clocks_end": {}, "cases": len(cases), "total_tflop": 0.0, "estimated_seconds": 1.0,
              "wall_seconds": 1.0, "full_layout_limit": 2.0**31, "tolerance": {"bf16": 1e-2}, "summary": rows}
    written = sweep.write_reports(tmp_path / "out", "correctness-tiled", report, rows, cases)
    assert [p.name for p in written] == [f"{p.name[:10]}-correctness-tiled.md" for p in written[:1]] + \
        [f"{written[0].name[:10]}-correctness-tiled.json"]
    summary = json.loads(written[1].read_text())
    assert "results" not in summary and written[1].stat().st_size < 10_000
    assert summary["failures"] == 2
    assert [c["case"] for c in summary["failed_cases"]] == ["tiled bf16 exact 7x9x5 aT.b", "tiled bf16 fuzz 8x8x8 a.bT"]
    (row,) = summary["summary"]
    assert (row["random_cases"], row["random_failures"], row["fuzz_cases"], row["exact_failures"]) == (3001, 1, 1, 1)
    assert row["worst_case"] == "tiled bf16 fuzz 8x8x8 a.bT" and row["max_rel_error"] == 0.5
    assert "- tiled bf16 exact 7x9x5 aT.b: 3 of 63 elements differ, 0 NaN" in written[0].read_text()

    per_case = tmp_path / "scratch" / "cases.json"
    written = sweep.write_reports(tmp_path / "out", "correctness-tiled", report, rows, cases, per_case)
    assert written[-1] == per_case
    detail = json.loads(per_case.read_text())
    assert len(detail["results"]) == len(cases) and "rel_error" in detail["result_columns"]


# --- scripts that time through harness.timing (CPU, with a stand-in for CUDA events) ---------


class _FakeEvent:
    """A CUDA event on a clock that the timed function advances."""
    clock = [0.0]

    def __init__(self, enable_timing=True):
        self.at = None

    def record(self):
        self.at = self.clock[0]

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.at - self.at


def _fake_cuda(monkeypatch, ms_per_call: float):
    from harness import timing

    monkeypatch.setattr(timing.torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    _FakeEvent.clock[0] = 0.0

    def tick():
        _FakeEvent.clock[0] += ms_per_call

    return tick


def test_demo_times_batches_rotating_its_input_sets(monkeypatch):
    import demo

    tick = _fake_cuda(monkeypatch, 0.1)
    seen = []
    sets = [("a0", "b0"), ("a1", "b1"), ("a2", "b2")]
    ms = demo.median_ms(lambda a, b, out: seen.append((a, b, out)) or tick(), sets, "out")
    assert abs(ms - 0.1) < 1e-9
    assert set(seen) == {(*s, "out") for s in sets}
    # warm-up and a probe of one call, a warm-up call, then batches of 20 calls (~2 ms)
    assert len(seen) == 1 + 1 + 1 + demo.BATCHES * 20


def test_model_benchmark_times_each_forward_as_a_batch_of_one(monkeypatch):
    import torch

    import model_benchmark

    tick = _fake_cuda(monkeypatch, 3.0)
    calls = []

    def forward():
        calls.append(1)
        tick()
        return torch.zeros(2)

    logits, ms = model_benchmark.time_case(forward, None, graphs=False, iters=7)
    assert ms == 3.0 and len(calls) == 1 + 7 and torch.equal(logits, torch.zeros(2))


def test_model_benchmark_alternates_the_two_models_and_keeps_the_median(monkeypatch):
    """The model part times torch's model and the kernelized one (the same weights) in
    rounds whose order alternates, keeps each side's median, and compares the other
    logits with torch's eager ones; a side that fails is reported and not retried."""
    import torch
    import transformers

    import model_benchmark  # puts examples/ on the path

    import kernelize_linear

    class FakeModel:
        def __init__(self, config):
            self.kernelized = False

        def to(self, dtype):
            return self

        def eval(self):
            return self

    def kernelize(model, **kwargs):
        model.kernelized = True

    monkeypatch.setattr(model_benchmark, "llama3_8b_config", lambda layers: None)
    transformers.LlamaForCausalLM  # noqa: B018 - the lazy load replaces the module in sys.modules
    monkeypatch.setattr(sys.modules["transformers"], "LlamaForCausalLM", FakeModel)
    monkeypatch.setattr(kernelize_linear, "kernelize_linears", kernelize)
    monkeypatch.setattr(kernelize_linear, "linear_repository", lambda build_dir: None)

    def cases(model, config):
        label = "kernelized" if model.kernelized else "torch"
        return [("prefill", 8, (label, "prefill"), None), ("decode", 1, (label, "decode"), lambda: None)]

    monkeypatch.setattr(model_benchmark, "model_cases", cases)
    # ms per (model, case, graphs), one value a round, in the rounds' order
    script = {("torch", "prefill", False): [5.0, 9.0, 6.0], ("kernelized", "prefill", False): [4.0, 30.0, 4.5],
              ("torch", "prefill", True): [3.0, 3.0, 3.0], ("kernelized", "prefill", True): [2.0, 2.0, 2.0],
              ("torch", "decode", False): [1.0, 1.0, 1.0], ("torch", "decode", True): [1.0, 1.0, 1.0],
              ("kernelized", "decode", True): [0.5, 0.5, 0.5]}
    order = []

    def time_case(forward, prefill, graphs, iters):
        label, case = forward
        order.append((label, case, graphs))
        if (label, case) == ("kernelized", "decode") and not graphs:
            raise RuntimeError("no kernel")
        logits = torch.ones(4) if label == "torch" else torch.tensor([1.0, 1.0, 1.0, 2.0])
        return logits, script[(label, case, graphs)].pop(0)

    monkeypatch.setattr(model_benchmark, "time_case", time_case)
    prefill, decode = model_benchmark.model_benchmark(model_benchmark.ROOT / "build", layers=1, iters=5, rounds=3)

    assert order[:6] == [("torch", "prefill", False), ("kernelized", "prefill", False),
                         ("kernelized", "prefill", False), ("torch", "prefill", False),
                         ("torch", "prefill", False), ("kernelized", "prefill", False)]
    assert prefill["torch_eager_ms"] == 6.0 and prefill["kernelized_eager_ms"] == 4.5
    assert prefill["eager_ratio"] == 6.0 / 4.5 and prefill["graph_ratio"] == 1.5
    assert prefill["kernelized_eager_rel_error"] == 0.5 and prefill["torch_graph_rel_error"] == 0.0
    assert decode["kernelized_eager_error"] == "RuntimeError: no kernel" and "eager_ratio" not in decode
    assert order.count(("kernelized", "decode", False)) == 1
    assert decode["graph_ratio"] == 2.0 and decode["kernelized_graph_rel_error"] == 0.5


def test_model_benchmark_host_cost_is_the_loop_per_call_and_the_table_names_the_floor(monkeypatch):
    """per_call_us: the enqueue time is the loop's, the wall time adds the final synchronize,
    each divided by the calls (fake clock: 2 us a call, 50 us to synchronize); the host
    table opens with the floor it was given."""
    import model_benchmark

    clock = [0.0]
    monkeypatch.setattr(model_benchmark.time, "perf_counter", lambda: clock[0])

    def synchronize():
        clock[0] += 50e-6

    monkeypatch.setattr(model_benchmark.torch.cuda, "synchronize", synchronize)
    calls = []

    def call():
        calls.append(1)
        clock[0] += 2e-6

    wall, enqueue = model_benchmark.per_call_us(call, calls=100, repeats=3)
    assert abs(enqueue - 2.0) < 1e-6 and abs(wall - 2.5) < 1e-6
    assert len(calls) == 3 * (20 + 100)  # 20 warm-up calls before each timed loop

    row = {"shape": "1x256x256", "ours": "pm.linear(x, w)", "torch": "F.linear(x, w)", "ours_wall_us": 10.0,
           "ours_enqueue_us": 9.0, "torch_wall_us": 12.5, "torch_enqueue_us": 12.0, "ratio_wall": 0.8,
           "ratio_enqueue": 0.75}
    lines = model_benchmark.host_markdown([row], {"torch.empty(1, 4096)": 2.5, "torch.zeros(1, 4096)": 8.1})
    text = "\n".join(lines)
    assert "`torch.empty(1, 4096)` 2.50 us, `torch.zeros(1, 4096)` 8.10 us" in text
    assert "| 1x256x256 | pm.linear(x, w) | 10.00 | 9.00 | F.linear(x, w) | 12.50 | 12.00 | 0.80 | 0.75 |" in text


def test_model_benchmark_takes_projections_by_name_or_as_n_by_k():
    import argparse

    import pytest

    import model_benchmark

    assert model_benchmark.parse_projection("8B o") == ("8B o", (4096, 4096))
    assert model_benchmark.parse_projection("1024x4096") == ("1024x4096", (1024, 4096))
    for bad in ("8B x", "1024x", "0x4096", "1024*4096"):
        with pytest.raises(argparse.ArgumentTypeError, match="unknown projection"):
            model_benchmark.parse_projection(bad)


def test_model_benchmark_shape_table_gives_each_case_its_clock_and_power():
    """Each projection row ends with the SM clock and power sampled after its case,
    blank where nothing was sampled (no nvidia-smi); the set's geomean follows."""
    import model_benchmark

    def case(m, torch_us, ours_us, clocks):
        results = {"torch": {"rel_error": 0.0, "eager_us": torch_us, "graph_us": torch_us},
                   "auto": {"rel_error": 1e-3, "eager_us": ours_us, "graph_us": ours_us,
                            "eager_ratio": torch_us / ours_us, "graph_ratio": torch_us / ours_us,
                            "graph_tflops": 1.0, "graph_gbs": 100.0}}
        return {"projection": "8B o", "m": m, "n": 4096, "k": 4096, "results": results, "clocks_after": clocks}

    rows = [case(512, 20.0, 25.0, {"sm_clock": "1620 MHz", "max_sm_clock": "1980 MHz", "power_draw": "668.10 W"}),
            case(1024, 30.0, 30.0, {})]
    lines = model_benchmark.shapes_markdown(rows, ["auto"], copy_gbs=3000.0)
    header = next(line for line in lines if line.startswith("| projection"))
    assert header.endswith("| rel. error | SM clock, power |")
    assert next(line for line in lines if "512x4096x4096" in line).endswith("| 1.0e-03 | 1620 MHz, 668.10 W |")
    assert next(line for line in lines if "1024x4096x4096" in line).endswith("| 1.0e-03 |  |")
    assert any(line.startswith("- prefill set, graph: geomean ratio 0.894 over 2 cases; lowest 0.80 (8B o, M=512)")
               for line in lines)


def test_model_benchmark_decode_set_names_the_copy_bandwidth_ceiling():
    """Below each decode-set geomean: the ratio a kernel moving each case's bytes
    (weights, x, output) at the copy bandwidth would reach against torch's times."""
    import model_benchmark

    def case(m, torch_us):
        results = {"torch": {"rel_error": 0.0, "eager_us": 2 * torch_us, "graph_us": torch_us},
                   "auto": {"rel_error": 1e-3, "eager_us": torch_us, "graph_us": torch_us,
                            "eager_ratio": 2.0, "graph_ratio": 1.0, "graph_tflops": 1.0, "graph_gbs": 100.0}}
        return {"projection": "8B o", "m": m, "n": 4096, "k": 4096, "results": results, "clocks_after": {}}

    # 1 x 4096 x 4096 moves 33,570,816 bytes: 11.19 us at 3000 GB/s; 16 tokens 33,816,576 (11.27 us).
    rows = [case(1, 22.380544), case(16, 11.272192), case(512, 30.0)]
    lines = model_benchmark.shapes_markdown(rows, ["auto"], copy_gbs=3000.0)
    graph = lines.index(next(line for line in lines if line.startswith("- decode set, graph:")))
    assert lines[graph + 1].startswith(f"  - at most {2 ** 0.5:.3f} (highest 2.00): ")
    eager = lines.index(next(line for line in lines if line.startswith("- decode set, eager:")))
    assert lines[eager + 1].startswith(f"  - at most {2 * 2 ** 0.5:.3f} (highest 4.00): ")
    assert not any(line.startswith("  - at most") for line in lines[graph + 2:])  # no ceiling for prefill


def test_model_benchmark_decode_bound_skips_the_linears_and_adds_their_bytes_at_copy_speed():
    """skip_linears leaves a model's other layers computing and its Linear layers
    returning tensors of their output's shape; the bound line divides torch's graph
    time by the rest's time plus the weights' bytes at the copy bandwidth."""
    import torch

    import model_benchmark

    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4).to(torch.bfloat16))
    assert model_benchmark.linear_weight_bytes(model) == 8 * 16 * 4 + 16 * 4 * 2
    x = torch.randn(3, 2, 8)
    assert torch.equal(model[0](x), x @ model[0].weight.t())
    model_benchmark.skip_linears(model)
    assert model[0](x).shape == (3, 2, 16) and model[2](x).shape == (3, 2, 4)
    assert model[1](-x.abs()).eq(0).all()  # the ReLU still computes

    rows = [{"case": "prefill 1x2048", "torch_graph_ms": 10.0},
            {"case": "decode batch 1 (KV cache 512)", "torch_graph_ms": 1.5},
            {"case": "decode batch 32 (KV cache 512)", "torch_eager_ms": 5.0}]
    bounds = {"decode batch 1 (KV cache 512)": {"graph_ms_without_linears": 0.5, "linear_weight_bytes": 2.4e9,
                                                "linear_ms_at_copy_bandwidth": 0.8},
              "decode batch 32 (KV cache 512)": {"graph_ms_without_linears": 0.6, "linear_weight_bytes": 2.4e9,
                                                 "linear_ms_at_copy_bandwidth": 0.8}}
    lines = model_benchmark.decode_bound_lines(rows, bounds)
    assert lines == ["- decode batch 1 (KV cache 512), graph: at most 1.154. Without its Linear layers torch's "
                     "forward takes 0.500 ms; their weights (2.40 GB) take 0.800 ms at the copy bandwidth.", ""]


def test_model_benchmark_kernel_specs_take_matmul_cluster_size(monkeypatch):
    """--kernels NAME runs pm.linear; NAME:cluster_size=N pm.matmul(x, w.t(), ...) with the
    option, on the rotating weight sets; anything else after the colon is refused by name."""
    import argparse

    import pytest

    import model_benchmark

    assert model_benchmark.parse_kernel_spec("auto") == ("auto", {})
    assert model_benchmark.parse_kernel_spec("wgmma_streamk:cluster_size=1") == ("wgmma_streamk", {"cluster_size": 1})
    for bad in ("wgmma_streamk:clusters=1", "wgmma_streamk:cluster_size=", "splitk:tile_order=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="unknown kernel option"):
            model_benchmark.parse_kernel_spec(bad)

    calls = []

    class FakePm:
        def linear(self, x, w, kernel):
            calls.append(("linear", x, w, kernel))

        def matmul(self, a, b, kernel, **options):
            calls.append(("matmul", a, b, kernel, options))

    import torch

    x, weights = torch.zeros(2, 4), [torch.ones(3, 4), torch.full((3, 4), 2.0)]
    model_benchmark.kernel_runner(FakePm(), "auto", x, weights)(3)
    model_benchmark.kernel_runner(FakePm(), "wgmma_streamk:cluster_size=1", x, weights)(2)
    (name, a, w, kernel), (name2, a2, b2, kernel2, options) = calls
    assert (name, kernel, name2, kernel2, options) == ("linear", "auto", "matmul", "wgmma_streamk", {"cluster_size": 1})
    assert a is x and w is weights[1] and a2 is x and torch.equal(b2, weights[0].t())
    monkeypatch.setattr(sys, "argv", ["model_benchmark.py"])
    with pytest.raises(SystemExit) as exit_info:
        model_benchmark.main(["--kernels", "auto", "splitk:order=2"])
    assert exit_info.value.code == 2


def test_compare_variants_sets_the_variants_side_by_side(tmp_path, repo_root, subprocess_env):
    """compare_variants.py pairs each case the two variants measured by its ratio to torch,
    marks those more than the tolerance apart, and names a missing run."""
    def benchmark(ratio):
        return {"environment": {"gpu": "NVIDIA H200", "torch": "2.11"},
                "rows": [{"m": 4096, "n": 4096, "k": 4096, "dtype": "bfloat16",
                          "results": {"torch.matmul": {"ratio": 1.0}, "wgmma_persistent": {"ratio": ratio}}}]}

    def decode(graph, eager):
        return {"shapes": [{"projection": "8B o", "m": 1, "n": 4096, "k": 4096,
                            "results": {"torch": {}, "auto": {"graph_ratio": graph, "eager_ratio": eager}}}]}

    runs = {"cu124-benchmark": benchmark(0.99), "cu130-benchmark": benchmark(1.00),
            "cu124-decode": decode(0.90, 0.95), "cu130-decode": decode(0.95, 0.95)}
    for name, run in runs.items():
        (tmp_path / f"2026-12-05-variant-{name}.json").write_text(json.dumps(run))
    out = tmp_path / "results"
    cmd = [sys.executable, str(SCRIPTS / "compare_variants.py"), str(tmp_path), "--out", str(out)]
    done = subprocess.run(cmd, cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    md = next(out.glob("*-variants.md")).read_text()
    assert "| 4096x4096x4096 bfloat16 wgmma_persistent | 0.990 | 1.000 | 0.990 |" in md
    assert "| 8B o 1x4096x4096 graph | 0.900 | 0.950 | 0.947 **outside** |" in md
    assert "| 8B o 1x4096x4096 eager | 0.950 | 0.950 | 1.000 |" in md
    assert "- GPU: NVIDIA H200" in md
    data = json.loads(next(out.glob("*-variants.json")).read_text())
    assert set(data["runs"]) == set(runs) and data["tolerance"] == 0.03
    (tmp_path / "2026-12-05-variant-cu124-decode.json").unlink()
    done = subprocess.run(cmd, cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "variant-cu124-decode.json" in done.stderr


def test_crash_search_lists_its_configurations_and_names_bad_shapes(repo_root, subprocess_env):
    """crash_search.py tries every rung and order at each shape, the skinny rungs only where b
    is K-major, and refuses a shape it cannot read before touching a GPU."""
    def run(*args):
        return subprocess.run([sys.executable, str(SCRIPTS / "crash_search.py"), *args], cwd=repo_root,
                              env=subprocess_env, capture_output=True, text=True, timeout=120)

    listed = run("--list", "--shapes", "64x64x64", "8x256x512:kmajor")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert "[0] 64x64x64 tiled" in lines and "[4] 64x64x64 wgmma_persistent" in lines
    assert not any("64x64x64 " in line and ("splitk" in line or "streamk" in line) for line in lines)
    assert any(line.endswith("8x256x512:kmajor wgmma_streamk") for line in lines)
    assert any("8x256x512:kmajor wgmma_persistent cluster_size=2 tile_order=split_tail" in line for line in lines)
    for bad, message in (("0x1x1", "at least 1"), ("4096x4096", "is not MxNxK"), ("8x8x8:nmajor", "':kmajor'")):
        done = run("--list", "--shapes", bad)
        assert done.returncode == 2 and message in done.stderr, (bad, done.stderr)


def test_crash_search_tells_a_refusal_from_a_failure(monkeypatch, capsys):
    """A configuration the op turns down (CTA pairs in a CUDA 12 build) is reported as refused
    and does not fail the search; a child that dies of a kernel fault does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("crash_search", SCRIPTS / "crash_search.py")
    crash_search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(crash_search)
    configs = crash_search.configurations(["64x64x64"])
    fault = {"value": None}

    def fake_run(cmd, **kwargs):
        (_, _, rung, opts) = configs[int(cmd[cmd.index("--one") + 1])]
        if opts.get("cluster_size") == 2:
            return subprocess.CompletedProcess(cmd, 1, "", "RuntimeError: persistent_matmul: cluster_size=2: this "
                                               "build (CUDA 12) has no CTA-pair kernels of wgmma_persistent")
        if rung == fault["value"]:
            return subprocess.CompletedProcess(cmd, 1, "", "RuntimeError: unspecified launch failure")
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"rel_error": 1e-3}) + "\n", "")

    monkeypatch.setattr(crash_search.subprocess, "run", fake_run)
    assert crash_search.main(["--shapes", "64x64x64"]) == 0
    out = capsys.readouterr().out
    assert out.count("refused by this build: ") == 2 and "0 of 11 configurations failed" in out
    fault["value"] = "wgmma"
    assert crash_search.main(["--shapes", "64x64x64"]) == 1
    assert "[3] 64x64x64 wgmma: FAIL (exit 1): RuntimeError: unspecified launch failure" in capsys.readouterr().out


def _write_recorded_timeline(path: Path, rows: list[list[int]], shape: str) -> None:
    """A timeline file as space/record.py writes it: one int64 tensor a rung, the
    columns, SM count, clock and shape in the metadata."""
    import torch
    from safetensors.torch import save_file

    columns = ["tile_m", "tile_n", "k_begin", "k_end", "sm", "cta", "start_ns", "end_ns"]
    kernels = {"wgmma_persistent": {"columns": columns, "tile_config": {"block_m": 128, "block_n": 128}}}
    save_file({"wgmma_persistent": torch.tensor(rows, dtype=torch.int64)}, str(path),
              metadata={"kernels": json.dumps(kernels), "sm_count": "4", "sm_clock": "1500 MHz", "shape": shape})


def test_timeline_stats_reads_a_recorded_timeline_without_a_gpu(repo_root, subprocess_env, tmp_path):
    """--recorded: the statistics of a file space/record.py wrote, and per split
    tile how long after its other parts the part ending at K ends."""
    path = tmp_path / "256x128x128.safetensors"
    _write_recorded_timeline(path, [
        [0, 0, 0, 128, 0, 0, 1_000, 11_000],  # a whole tile
        [1, 0, 0, 64, 1, 1, 1_000, 7_000],    # tile (1, 0) in two parts: the first ends at 6 us ...
        [1, 0, 64, 128, 2, 2, 1_000, 10_500],  # ... the one ending at K at 9.5 us: 3.5 us later
    ], "256x128x128")
    done = subprocess.run([sys.executable, str(SCRIPTS / "timeline_stats.py"), "--recorded", str(path)],
                          cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "recorded on 4 SMs at 1500 MHz" in done.stdout
    assert "wgmma_persistent 256x128x128: 3 tiles on 3 CTAs, 3 SMs" in done.stdout
    assert "makespan 10.0 us" in done.stdout
    assert "whole tiles: 1, median 10.00 us" in done.stdout
    assert "split tiles: 1 in 2 parts" in done.stdout
    assert "the part ending at K after its tile's others: 3.5/3.5/3.5 us" in done.stdout


def test_timeline_stats_names_a_rung_the_recording_lacks(repo_root, subprocess_env, tmp_path):
    path = tmp_path / "64x64x64.safetensors"
    _write_recorded_timeline(path, [[0, 0, 0, 64, 0, 0, 0, 1_000]], "64x64x64")
    done = subprocess.run([sys.executable, str(SCRIPTS / "timeline_stats.py"), "--recorded", str(path), "tiled"],
                          cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "has no timeline of tiled; it has wgmma_persistent" in done.stderr


def test_timeline_stats_names_a_recording_it_cannot_read(repo_root, subprocess_env, tmp_path):
    """A file that is not a timeline, and one whose tiles do not cover the output,
    end with the Space loader's message, not a traceback."""
    not_a_timeline = tmp_path / "notes.safetensors"
    not_a_timeline.write_text("not safetensors")
    gap = tmp_path / "256x128x128.safetensors"
    _write_recorded_timeline(gap, [[0, 0, 0, 128, 0, 0, 0, 1_000]], "256x128x128")  # tile (1, 0) is missing
    for path, says in ((not_a_timeline, "could not read notes.safetensors"), (gap, "sanity check")):
        done = subprocess.run([sys.executable, str(SCRIPTS / "timeline_stats.py"), "--recorded", str(path)],
                              cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
