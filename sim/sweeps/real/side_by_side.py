#!/usr/bin/env python3
"""esroute and vllm-router side by side on the fake fleet, with essim's
prediction for each esroute configuration (docs/ROUTING.md, "Real processes").

Per run (a configuration at a load): a cold `essim serve` fleet of 8 engines
at time scale K (a fresh engine-state directory), the configuration's routers
as separate processes, `essim replay` of the agentic trace round-robin over
the routers' URLs, then everything stopped (SIGTERM, then SIGKILL: nothing is
left behind, on Ctrl-C or an error too). For an esroute configuration, the
matching `essim run` is the prediction. The engines publish, and esroute
polls, every max(1, round(50 / K)) ms of wall time: 50 ms modelled.

    python3 sim/sweeps/real/side_by_side.py                 # the whole matrix
    python3 sim/sweeps/real/side_by_side.py --list
    python3 sim/sweeps/real/side_by_side.py --only esroute-unified-engine-r1 --loads 1

Writes into --out (default sim/sweeps/real/out): runs/<config>@<load>x/
(each process's log, the replay's requests.csv and summary.json, essim's
prediction, result.json), then results.csv, table.md and ttft_p90.svg over
every result.json there (so a partial rerun updates its rows only).
Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
VLLM_ROUTER = Path.home() / ".cache/engine-state/vllm-router-venv/bin/vllm-router"
MODEL = "essim"
READY_S = 60.0
# A later turn sent within this many modelled seconds of its predecessor's
# end counts as having waited on it.
WAITED_S = 0.2
STOP_S = 5.0


@dataclass(frozen=True)
class Config:
    name: str
    router: str  # "esroute" or "vllm-router"
    policy: str
    replicas: int
    cache: str = ""  # esroute: engine or estimated
    share: bool = False  # esroute: --share-reservations


def configurations(matrix: dict) -> list[Config]:
    out = []
    es = matrix["esroute"]
    for policy in es["policies"]:
        for cache in es["cache_knowledge"]:
            for r in es["routers"]:
                name = f"esroute-{policy}-{cache}-{r['suffix']}"
                out.append(Config(name, "esroute", policy, r["replicas"], cache, r["share"]))
    vr = matrix["vllm_router"]
    for policy in vr["policies"]:
        for n in vr["instances"]:
            out.append(Config(f"vllm-router-{policy}-x{n}", "vllm-router", policy, n))
    return out


def wall_period_ms(time_scale: float, modelled_ms: float) -> int:
    return max(1, round(modelled_ms / time_scale))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- processes -----------------------------------------------------------------


class Processes:
    """Child processes, each in its own process group, all stopped by stop()."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []

    def start(self, argv: list[str], log_path: Path, stdout_pipe: bool = False, env=None):
        log_file = open(log_path, "wb")
        child = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if stdout_pipe else log_file,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        log_file.close()  # the child holds its own descriptor
        self.children.append(child)
        lines: queue.Queue[str | None] = queue.Queue()
        if stdout_pipe:

            def pump() -> None:
                for raw in child.stdout:
                    lines.put(raw.decode(errors="replace").rstrip("\n"))
                lines.put(None)

            threading.Thread(target=pump, daemon=True).start()
        return child, lines

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_S
        for child in self.children:
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for child in self.children:
            try:  # the group too: a child's own children go with it
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            child.wait()
        self.children.clear()


def read_lines(child, lines: queue.Queue, count: int, what: str) -> list[str]:
    """The first `count` stdout lines of `child`, within READY_S."""
    deadline = time.monotonic() + READY_S
    got: list[str] = []
    while len(got) < count:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"{what}: not ready within {READY_S:g} s") from None
        if line is None:
            raise RuntimeError(f"{what} exited (code {child.wait()}) before it was ready")
        got.append(line)
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(child, url: str, what: str) -> None:
    deadline = time.monotonic() + READY_S
    while True:
        if child.poll() is not None:
            raise RuntimeError(f"{what} exited (code {child.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {url}/health not 200 within {READY_S:g} s")
        time.sleep(0.05)


def scrape_prefix_hits(urls: list[str]) -> float:
    """vllm:prefix_cache_hits / queries over the fleet (NaN when unreadable)."""
    hits = queries = 0.0
    for url in urls:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return math.nan
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name == "vllm:prefix_cache_hits_total":
                hits += float(line.rsplit(" ", 1)[1])
            elif name == "vllm:prefix_cache_queries_total":
                queries += float(line.rsplit(" ", 1)[1])
    return hits / queries if queries else math.nan


# ---- summaries -----------------------------------------------------------------


def quantile_s(summary: dict, metric: str, q: str) -> float:
    """`metric` (ttft, tpot, e2e) at `q` (p50, p90, p99, mean) in seconds,
    from essim run's summary (ttft_p90_s, tpot_p90_ms) or essim replay's
    ({"ttft_s": {"p90": s}})."""
    for key, factor in ((f"{metric}_{q}_s", 1.0), (f"{metric}_{q}_ms", 1e-3)):
        if summary.get(key) is not None:
            return float(summary[key]) * factor
    nested = summary.get(f"{metric}_s")
    if isinstance(nested, dict) and nested.get(q) is not None:
        return float(nested[q])
    return math.nan


def replay_counts(summary: dict) -> tuple[int, int]:
    """(requests that completed, those that did not) from the replay's summary."""
    outcomes = summary["outcomes"]
    ok = int(outcomes.get("ok", 0))
    errors = sum(int(v) for k, v in outcomes.items() if k != "ok")
    return ok, errors


def session_stats(requests_csv: Path) -> tuple[float, float]:
    """From the replay's requests.csv: the share of later turns sent as soon
    as their predecessor ended (they waited on it: essim run's open loop
    would have sent them earlier), and the mean distinct engines per
    session (esroute names its engine in a response header; NaN without)."""
    by_session: dict[str, list[dict]] = {}
    with open(requests_csv) as f:
        for row in csv.DictReader(f):
            if row["session"]:
                by_session.setdefault(row["session"], []).append(row)
    waited = later = 0
    engines = []
    for rows in by_session.values():
        rows.sort(key=lambda r: int(r["id"]))
        for before, after in zip(rows, rows[1:], strict=False):
            if not (before["e2e_s"] and after["sent_s"]):
                continue
            later += 1
            ended = float(before["sent_s"]) + float(before["e2e_s"])
            waited += float(after["sent_s"]) - ended < WAITED_S
        named = {r["engine"] for r in rows if r["engine"]}
        if named:
            engines.append(len(named))
    share = waited / later if later else math.nan
    return share, (sum(engines) / len(engines) if engines else math.nan)


def read_json(path: Path):
    data = json.loads(path.read_text())
    return data[0] if isinstance(data, list) else data


# ---- one run -------------------------------------------------------------------


@dataclass
class Setup:
    bin: Path
    vllm_router: Path
    engines: int
    seed: int
    sessions: int
    time_scale: float
    feed_ms: int  # wall
    out: Path

    @property
    def modelled_feed_ms(self) -> float:
        return self.feed_ms * self.time_scale


def start_routers(
    setup: Setup, config: Config, procs: Processes, engines, uri, run_dir
) -> list[str]:
    """The configuration's routers in front of `engines` ((id, URL) pairs); their URLs."""
    router_urls = []
    for j in range(config.replicas):
        what = f"{config.router} {j}"
        if config.router == "esroute":
            argv = [str(setup.bin / "esroute"), "--listen", "127.0.0.1:0"]
            for engine_id, url in engines:
                argv += ["--engine", f"{engine_id}={url}"]
            argv += ["--policy", config.policy, "--cache-knowledge", config.cache]
            argv += ["--uri", uri, "--poll-ms", str(setup.feed_ms), "--replica-id", f"r{j}"]
            if config.share:
                argv.append("--share-reservations")
            env = dict(os.environ, RUST_LOG="warn")
            child, lines = procs.start(argv, run_dir / f"esroute-{j}.log", True, env)
            (line,) = read_lines(child, lines, 1, what)
            prefix = "esroute listening on "
            if not line.startswith(prefix):
                raise RuntimeError(f"{what}: unexpected first line {line!r}")
            router_urls.append("http://" + line[len(prefix) :])
        else:
            port = free_port()
            argv = [str(setup.vllm_router), "--host", "127.0.0.1", "--port", str(port)]
            argv += ["--worker-urls", *(url for _, url in engines), "--policy", config.policy]
            argv += ["--prometheus-port", str(free_port()), "--log-level", "warning"]
            child, _ = procs.start(argv, run_dir / f"vllm-router-{j}.log")
            url = f"http://127.0.0.1:{port}"
            wait_healthy(child, url, what)
            router_urls.append(url)
    return router_urls


def predict(setup: Setup, config: Config, load: float, run_dir: Path) -> dict:
    """essim run of the same configuration: its summary.json."""
    out = run_dir / "essim-run"
    argv = [str(setup.bin / "essim"), "run", "--format", "agentic"]
    argv += ["--seed", str(setup.seed), "--sessions", str(setup.sessions)]
    argv += ["--rate-scale", f"{load:g}", "--engines", str(setup.engines)]
    argv += ["--policy", config.policy, "--cache-knowledge", config.cache]
    argv += ["--routers", str(config.replicas), "--no-migration"]
    argv += ["--feed", f"periodic:{setup.modelled_feed_ms:g}", "--out", str(out)]
    if config.share:
        argv.append("--share-reservations")
    with open(run_dir / "essim-run.log", "wb") as log_file:
        subprocess.run(argv, cwd=ROOT, stdout=log_file, stderr=log_file, check=True)
    return read_json(out / "summary.json")


def run_one(setup: Setup, config: Config, load: float) -> dict:
    run_dir = setup.out / "runs" / f"{config.name}@{load:g}x"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    predicted = predict(setup, config, load, run_dir) if config.router == "esroute" else None
    procs = Processes()
    # The engine-state directory inside a fresh one: its siblings (DIR.cache,
    # DIR.routers) go with it.
    state = tempfile.mkdtemp(prefix="side-by-side-")
    started = time.monotonic()
    try:
        uri = f"file://{state}/state"
        argv = [str(setup.bin / "essim"), "serve", "--engines", str(setup.engines)]
        argv += ["--listen-base", "127.0.0.1:0", "--time-scale", f"{setup.time_scale:g}"]
        argv += ["--uri", uri, "--period-ms", str(setup.feed_ms), "--model", MODEL]
        fleet, lines = procs.start(argv, run_dir / "essim-serve.log", True)
        ready = read_lines(fleet, lines, setup.engines, "essim serve")
        engines = []  # (engine id, URL), as essim serve printed them
        for line in ready:
            engine_id, _, url = line.partition(" ")
            if not engine_id.startswith("sim-") or not url.startswith("http://"):
                raise RuntimeError(f"essim serve: unexpected ready line {line!r}")
            engines.append((engine_id, url))
        urls = [url for _, url in engines]
        router_urls = start_routers(setup, config, procs, engines, uri, run_dir)
        argv = [str(setup.bin / "essim"), "replay"]
        for url in router_urls:
            argv += ["--url", url]
        argv += ["--format", "agentic", "--seed", str(setup.seed)]
        argv += ["--sessions", str(setup.sessions), "--rate-scale", f"{load:g}"]
        argv += ["--time-scale", f"{setup.time_scale:g}", "--prompt", "text"]
        argv += ["--endpoint", "completions", "--model", MODEL]
        argv += ["--out", str(run_dir / "replay"), "--timeout-s", "3600"]
        argv += ["--max-in-flight", "4096"]
        replay, _ = procs.start(argv, run_dir / "replay.log")
        replay.wait()
        if replay.returncode != 0:
            raise RuntimeError(f"essim replay exited with {replay.returncode}: {run_dir}")
        hit_rate = scrape_prefix_hits(urls)
    finally:
        procs.stop()
        shutil.rmtree(state, ignore_errors=True)
    real = read_json(run_dir / "replay" / "summary.json")
    ok, errors = replay_counts(real)
    waited, engines_per_session = session_stats(run_dir / "replay" / "requests.csv")
    result = {
        "config": config.name,
        "router": config.router,
        "load": load,
        "time_scale": setup.time_scale,
        "sessions": setup.sessions,
        "requests": ok,
        "errors": errors,
        "ttft_p50_s": quantile_s(real, "ttft", "p50"),
        "ttft_p90_s": quantile_s(real, "ttft", "p90"),
        "ttft_p99_s": quantile_s(real, "ttft", "p99"),
        "tpot_p90_ms": quantile_s(real, "tpot", "p90") * 1e3,
        "e2e_p90_s": quantile_s(real, "e2e", "p90"),
        "prefix_hit_rate": hit_rate,
        "engines_per_session": engines_per_session,
        "turns_waited": waited,
        "wall_s": time.monotonic() - started,
    }
    if predicted is not None:
        result.update(
            pred_requests=predicted.get("requests"),
            pred_ttft_p90_s=quantile_s(predicted, "ttft", "p90"),
            pred_tpot_p90_ms=quantile_s(predicted, "tpot", "p90") * 1e3,
            pred_e2e_p90_s=quantile_s(predicted, "e2e", "p90"),
            pred_prefix_hit_rate=predicted.get("prefix_hit_rate", math.nan),
            pred_engines_per_session=predicted.get("engines_per_session_mean", math.nan),
        )
        pred = result["pred_ttft_p90_s"]
        result["real_over_pred"] = result["ttft_p90_s"] / pred if pred else math.nan
    (run_dir / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# ---- reports -------------------------------------------------------------------

COLUMNS = [
    "config",
    "load",
    "requests",
    "errors",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p90_ms",
    "e2e_p90_s",
    "prefix_hit_rate",
    "pred_ttft_p90_s",
    "real_over_pred",
    "pred_tpot_p90_ms",
    "pred_e2e_p90_s",
    "pred_prefix_hit_rate",
    "engines_per_session",
    "pred_engines_per_session",
    "turns_waited",
    "time_scale",
    "sessions",
    "wall_s",
]


def gather(out: Path, order: list[Config]) -> list[dict]:
    rank = {c.name: i for i, c in enumerate(order)}
    rows = [json.loads(p.read_text()) for p in (out / "runs").glob("*/result.json")]
    return sorted(rows, key=lambda r: (rank.get(r["config"], len(rank)), r["config"], r["load"]))


def cell(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def write_reports(out: Path, rows: list[dict]) -> None:
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in COLUMNS})
    loads = sorted({r["load"] for r in rows})
    by = {(r["config"], r["load"]): r for r in rows}
    head = "| configuration |"
    rule = "|---|"
    for load in loads:
        head += f" TTFT p90 {load:g}× real s | essim s | real / essim |"
        rule += "---|---|---|"
    pivot = [head + " errors |", rule + "---|"]
    for name in dict.fromkeys(r["config"] for r in rows):
        line = f"| {name} |"
        errors = 0
        for load in loads:
            r = by.get((name, load), {})
            errors += r.get("errors", 0)
            line += f" {cell(r.get('ttft_p90_s'))} | {cell(r.get('pred_ttft_p90_s'))} |"
            line += f" {cell(r.get('real_over_pred'))} |"
        pivot.append(line + f" {errors} |")
    lines = [
        "| configuration | load | TTFT p50 s | p90 s | p99 s | TPOT p90 ms | E2E p90 s "
        "| prefix hit | engines / session | turns waited | errors | essim TTFT p90 s "
        "| real / essim |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['load']:g}× | {cell(r['ttft_p50_s'])} | "
            f"{cell(r['ttft_p90_s'])} | {cell(r['ttft_p99_s'])} | {cell(r['tpot_p90_ms'], 1)} | "
            f"{cell(r['e2e_p90_s'])} | {cell(r['prefix_hit_rate'])} | "
            f"{cell(r.get('engines_per_session'))} | {cell(r.get('turns_waited'))} | "
            f"{r['errors']} | {cell(r.get('pred_ttft_p90_s'))} | {cell(r.get('real_over_pred'))} |"
        )
    text = "\n".join(pivot) + "\n\nEvery measure (modelled seconds; TPOT ms):\n\n"
    (out / "table.md").write_text(text + "\n".join(lines) + "\n")
    (out / "ttft_p90.svg").write_text(svg(rows))


def svg(rows: list[dict]) -> str:
    """Horizontal bars of TTFT p90 per configuration: real and essim, per load;
    a log axis (the values span decades)."""
    loads = sorted({r["load"] for r in rows})
    names = list(dict.fromkeys(r["config"] for r in rows))
    by = {(r["config"], r["load"]): r for r in rows}
    series = []  # (label, colour, key)
    palette = [("#1f77b4", "#aec7e8"), ("#d62728", "#ff9896"), ("#2ca02c", "#98df8a")]
    for k, load in enumerate(loads):
        real, pred = palette[k % len(palette)]
        series.append((f"real {load:g}×", real, load, "ttft_p90_s"))
        series.append((f"essim {load:g}×", pred, load, "pred_ttft_p90_s"))
    values = [
        by[(n, s[2])].get(s[3])
        for n in names
        for s in series
        if (n, s[2]) in by and by[(n, s[2])].get(s[3])
    ]
    values = [v for v in values if v and v > 0 and not math.isnan(v)]
    lo = 10 ** math.floor(math.log10(min(values))) if values else 0.01
    hi = 10 ** math.ceil(math.log10(max(values))) if values else 10
    hi = max(hi, lo * 10)
    bar, gap, left, width, top = 7, 8, 250, 480, 40
    group = bar * len(series) + gap
    height = top + group * len(names) + 40

    def x(v: float) -> float:
        return left + width * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 30}" '
        f'height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">TTFT p90 (modelled s, log scale): '
        "real runs and essim's prediction</text>",
    ]
    for k, (label, colour, _, _) in enumerate(series):
        out.append(f'<rect x="{left + 110 * k}" y="24" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{left + 110 * k + 14}" y="33">{label}</text>')
    decade = lo
    while decade <= hi * 1.0001:
        out.append(
            f'<line x1="{x(decade):.1f}" y1="{top}" x2="{x(decade):.1f}" '
            f'y2="{height - 30}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{x(decade):.1f}" y="{height - 16}" text-anchor="middle">{decade:g}</text>'
        )
        decade *= 10
    for i, name in enumerate(names):
        y0 = top + i * group
        out.append(
            f'<text x="{left - 6}" y="{y0 + group / 2 + 3:.1f}" text-anchor="end">{name}</text>'
        )
        for k, (_, colour, load, key) in enumerate(series):
            v = by.get((name, load), {}).get(key)
            if v is None or not v > 0:
                continue
            y = y0 + k * bar
            out.append(
                f'<rect x="{left}" y="{y}" width="{max(1.0, x(v) - left):.1f}" '
                f'height="{bar - 1}" fill="{colour}"><title>{name} {key} {load:g}×: '
                f"{v:.3f} s</title></rect>"
            )
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---- main ----------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", type=Path, default=HERE / "matrix.json")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--only", help="configurations to run, comma-separated (globs allowed)")
    parser.add_argument("--loads", help="agentic rate scales, comma-separated (matrix: 1,2)")
    parser.add_argument("--list", action="store_true", help="list the configurations and exit")
    parser.add_argument("--time-scale", type=float, help="K (matrix default)")
    parser.add_argument("--sessions", type=int, help="agentic sessions (matrix default)")
    parser.add_argument("--seed", type=int, help="agentic seed (matrix default)")
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
    parser.add_argument("--bin", type=Path, default=target, help="essim and esroute (release)")
    parser.add_argument("--vllm-router", type=Path, default=VLLM_ROUTER)
    parser.add_argument("--report", action="store_true", help="only rebuild the reports")
    args = parser.parse_args()

    matrix = json.loads(args.matrix.read_text())
    order = configurations(matrix)
    chosen = order
    if args.only:
        patterns = args.only.split(",")
        chosen = [c for c in order if any(fnmatch.fnmatch(c.name, p) for p in patterns)]
        if not chosen:
            parser.error(f"--only {args.only}: no such configuration (see --list)")
    loads = [float(v) for v in args.loads.split(",")] if args.loads else matrix["loads"]
    if args.list:
        for c in chosen:
            print(c.name)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        write_reports(args.out, gather(args.out, order))
        return 0
    time_scale = args.time_scale or matrix["time_scale"]
    setup = Setup(
        bin=args.bin.resolve(),
        vllm_router=args.vllm_router,
        engines=matrix["engines"],
        seed=args.seed if args.seed is not None else matrix["seed"],
        sessions=args.sessions or matrix["sessions"],
        time_scale=time_scale,
        feed_ms=wall_period_ms(time_scale, matrix["feed_period_ms"]),
        out=args.out.resolve(),
    )
    for tool in (setup.bin / "essim", setup.bin / "esroute"):
        if not tool.exists():
            parser.error(f"{tool} is missing: cargo build --release --bins (make bins)")
    if any(c.router == "vllm-router" for c in chosen) and not setup.vllm_router.exists():
        parser.error(f"{setup.vllm_router} is missing: make vllm-router-venv")

    # SIGTERM as Ctrl-C: the finally blocks stop every child.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    runs = [(c, load) for c in chosen for load in loads]
    log(
        f"side by side: {len(runs)} runs, K={time_scale:g}, {setup.sessions} sessions, "
        f"feed {setup.feed_ms} ms wall = {setup.modelled_feed_ms:g} ms modelled"
    )
    started = time.monotonic()
    failed = 0
    try:
        for n, (config, load) in enumerate(runs, 1):
            try:
                r = run_one(setup, config, load)
            except (RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as e:
                failed += 1
                log(f"[{n}/{len(runs)}] {config.name} @{load:g}x FAILED: {e}")
                continue
            pred = r.get("pred_ttft_p90_s")
            vs = f" (essim {pred:.3f} s, ×{r['real_over_pred']:.2f})" if pred else ""
            log(
                f"[{n}/{len(runs)}] {config.name} @{load:g}x: TTFT p90 {r['ttft_p90_s']:.3f} s"
                f"{vs}, {r['requests']} ok, {r['errors']} errors, {r['wall_s']:.0f} s wall, "
                f"{time.monotonic() - started:.0f} s so far"
            )
            write_reports(setup.out, gather(setup.out, order))
    except KeyboardInterrupt:
        log("interrupted: every child stopped")
        return 130
    total = time.monotonic() - started
    log(f"done: {len(runs) - failed}/{len(runs)} runs in {total / 60:.1f} min; {setup.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
