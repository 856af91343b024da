"""How fast ``agentgym view`` opens a large eval run: 10,000 synthetic episodes.

The run is written with the real writers (``append_jsonl`` for ``episodes.jsonl``, the eval runner's
``summarize`` for ``summary.json``); each episode is shaped like SmolLM2-135M's Demo-v0 episodes through vLLM
(the first prompt ~350 tokens, ~56 per later turn, ~9-30 generated tokens per turn with logprobs, 1-12 turns, a
third solved), about 8 KB a line. Figures, over ``--reps`` repetitions, the arms interleaved in each:

* ``index_build_s`` (``json`` vs ``msgspec``): build the episode index (every row) from the file with Python's
  ``json`` decoding whole lines, and with the typed head decoder the viewer uses; both produce the same rows
  (checked). ``*_cpu_s``: the CPU seconds this process spent on it (``time.process_time``): the work itself,
  which the wall-clock on a shared machine inflates by the time spent waiting for a core.
* ``open_http_s``: a cold start: a new ``Site`` and server, then what the page requests before it shows the run
  (``/``, ``app.js``, ``app.css``, ``data/index.json``, ``data/run/0.json``: the episode table, summary and
  breakdown). ``run_doc_bytes`` is the size of that last document.
* ``browser_s`` (with ``--browser``): headless Chromium on a cold server, from navigation to the run page with
  its first 200 episode rows in the DOM (``performance.now()`` read by the page when they are there).
* ``episode_s``: one episode opened on a warm server (its chunk of 64); ``search_load_s``: every chunk, what a
  full-text search loads.

Usage: ``python benchmarks/bench_view.py [--episodes 10000] [--reps 5] [--browser]``; writes
``benchmarks/results/view.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

import agentgym
from agentgym.eval.runner import EvalConfig, summarize
from agentgym.eval.stats import mean_ci
from agentgym.rollout.jsonl import append_jsonl
from agentgym.types import Message, Trajectory, Turn
from agentgym.view import Site, ViewServer
from agentgym.view.index import JsonlIndex, episode_head, episode_key, episode_row

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "view.json"
ENV = "agentgym/Demo-v0"
SYSTEM = ("You are playing a guessing game. A secret integer lies between 0 and 63. Call the guess tool with an integer; "
          "you will be told whether the secret is higher or lower. To call a tool, write <tool_call>{\"name\": "
          "TOOL_NAME, \"arguments\": {...}}</tool_call>. Available tools: guess, give_up.")


def synthetic_episode(rng: random.Random, i: int, tasks: int) -> Trajectory:
    task = f"guess-{2 * (i % tasks) + 1}"
    seed, sample = (i // tasks) % 5, i // (tasks * 5)
    n_turns = rng.randint(1, 12)
    success = rng.random() < 0.33
    turns: list[Turn] = []
    messages: list[Message] = [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": "Find the secret number."}]
    for k in range(n_turns):
        g = rng.randint(0, 63)
        n_gen = rng.randint(9, 30)
        text = f"I will guess {g}. <tool_call>{{\"name\": \"guess\", \"arguments\": {{\"n\": {g}}}}}</tool_call>"
        last = k == n_turns - 1
        obs: list[Message] = [{"role": "tool", "tool_call_id": "call_0", "name": "guess",
                               "content": "correct" if last and success else rng.choice(["higher", "lower"])}]
        turns.append(Turn("vllm:smollm2", prompt_token_ids=[rng.randrange(49152) for _ in range(353 if k == 0 else 56)],
                          completion_token_ids=[rng.randrange(49152) for _ in range(n_gen)],
                          completion_logprobs=[-rng.random() * 3 for _ in range(n_gen)], weight_version=0, text=text,
                          tool_calls=[{"id": "call_0", "name": "guess", "arguments": {"n": g}}], observation=obs,
                          reward=1.0 if last and success else 0.0, new_session=k == 0,
                          timing={"policy_s": rng.random() * 0.5, "env_s": rng.random() * 0.01}))
        messages += [{"role": "assistant", "content": text}, *obs]
    key = f"{ENV}|{task}|seed={seed}|sample={sample}"
    return Trajectory(task, ENV, group_id=key, turns=turns, messages=messages, reward=float(success), success=success,
                      terminated=success, truncated=not success, truncated_reason=None if success else "max_turns",
                      metrics={"turns": n_turns, "generated_tokens": sum(len(t.completion_token_ids) for t in turns),
                               "prompt_tokens": sum(len(t.prompt_token_ids) for t in turns), "parse_errors": 0},
                      timing={"wall_s": rng.random() * 5},
                      info={"eval_key": key, "seed": seed, "sample": sample, "task_type": "guess", "split": "test"})


def make_run(out: Path, episodes: int) -> None:
    rng = random.Random(0)
    tasks = 32
    trajs = [synthetic_episode(rng, i, tasks) for i in range(episodes)]
    append_jsonl(out / "episodes.jsonl", trajs)
    seeds = sorted({t.info["seed"] for t in trajs})
    cfg = EvalConfig([ENV], tasks=tasks, seeds=seeds, samples=max(1, episodes // (tasks * 5)))
    protocol = {"envs": {ENV: {"task_ids": sorted({t.task_id for t in trajs})}}, "policy": {"spec": "synthetic"},
                "seeds": seeds, "samples": cfg.samples, "split": "test"}
    summary = summarize(trajs, cfg, protocol)
    summary["complete"] = True
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))


def get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Sec-Fetch-Site": "same-origin"})
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"GET {path}: {r.status} {body[:200]!r}")
        return body
    finally:
        conn.close()


def index_build(path: Path, decode: Any) -> tuple[float, float, list[dict[str, Any]]]:
    t, c = time.perf_counter(), time.process_time()
    idx = JsonlIndex(path, episode_row, episode_key, decode=decode)
    idx.refresh()
    return time.perf_counter() - t, time.process_time() - c, idx.rows


def open_http(run: Path) -> tuple[float, float, int]:
    t, c = time.perf_counter(), time.process_time()
    with ViewServer(Site([run])) as srv:
        for p in ("/", "/app.js", "/app.css", "/data/index.json"):
            get(srv.port, p)
        size = len(get(srv.port, "/data/run/0.json"))
        dt, dc = time.perf_counter() - t, time.process_time() - c
    return dt, dc, size


def warm_reads(run: Path, episodes: int) -> tuple[float, float]:
    with ViewServer(Site([run])) as srv:
        get(srv.port, "/data/run/0.json")
        t = time.perf_counter()
        get(srv.port, f"/data/run/0/chunk/{(episodes // 2) // 64}.json")
        episode = time.perf_counter() - t
        t = time.perf_counter()
        for k in range((episodes + 63) // 64):
            get(srv.port, f"/data/run/0/chunk/{k}.json")
        return episode, time.perf_counter() - t


class Browser:
    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        os.environ["SE_OFFLINE"] = "true"
        self.profile = tempfile.mkdtemp(prefix="bench-view-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for f in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                  "--window-size=1400,1000", f"--user-data-dir={self.profile}"):
            opts.add_argument(f)
        self.driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                                       options=opts)

    def open_run(self, run: Path) -> float:
        from selenium.webdriver.support.ui import WebDriverWait

        with ViewServer(Site([run])) as srv:
            self.driver.get("about:blank")
            self.driver.get(srv.url + "#/run/0")
            return float(WebDriverWait(self.driver, 300, poll_frequency=0.01).until(lambda d: d.execute_script(
                "return document.querySelectorAll('tr[data-episode]').length >= 200 && performance.now() / 1000")))

    def close(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)


def chromium_version() -> str | None:
    exe = shutil.which("chromium")
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    return out.strip() or None


def stats(xs: list[float]) -> dict[str, Any]:
    return {**mean_ci(xs), "samples": xs, "min": min(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--browser", action="store_true", help="also time the page in headless Chromium")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    prov = Provenance.start(packages=["msgspec", "selenium"])
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-view-"))
    browser = Browser() if args.browser else None
    try:
        run = tmp / "run"
        run.mkdir()
        t = time.perf_counter()
        make_run(run, args.episodes)
        print(f"wrote {args.episodes} episodes ({(run / 'episodes.jsonl').stat().st_size / 1e6:.1f} MB) in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        # warm-up: every arm once (the file in the page cache, imports, the browser's first start)
        index_build(run / "episodes.jsonl", json.loads)
        index_build(run / "episodes.jsonl", episode_head)
        open_http(run)
        if browser:
            browser.open_run(run)
        arms: dict[str, list[float]] = {k: [] for k in (
            "index_build_json_s", "index_build_msgspec_s", "open_http_s", "index_build_json_cpu_s",
            "index_build_msgspec_cpu_s", "open_http_cpu_s", "episode_s", "search_load_s", "browser_s")}
        run_doc_bytes = 0
        for rep in range(args.reps):
            order = ["json", "msgspec"] if rep % 2 == 0 else ["msgspec", "json"]
            rows: dict[str, list[dict[str, Any]]] = {}
            for arm in order:
                dt, dc, rows[arm] = index_build(run / "episodes.jsonl", json.loads if arm == "json" else episode_head)
                arms[f"index_build_{arm}_s"].append(dt)
                arms[f"index_build_{arm}_cpu_s"].append(dc)
            if rows["json"] != rows["msgspec"]:
                raise SystemExit("the two decoders built different rows")
            dt, dc, run_doc_bytes = open_http(run)
            arms["open_http_s"].append(dt)
            arms["open_http_cpu_s"].append(dc)
            ep, search = warm_reads(run, args.episodes)
            arms["episode_s"].append(ep)
            arms["search_load_s"].append(search)
            if browser:
                arms["browser_s"].append(browser.open_run(run))
            print(f"rep {rep}: " + ", ".join(f"{k}={v[-1]:.3f}" for k, v in arms.items() if v), flush=True)
        result = {
            "argv": sys.argv,
            "episodes": args.episodes,
            "episodes_jsonl_bytes": (run / "episodes.jsonl").stat().st_size,
            "run_doc_bytes": run_doc_bytes,
            "reps": args.reps,
            "figures_s": {k: stats(v) for k, v in arms.items() if v},
            "versions": {"agentgym": agentgym.__version__, "python": platform.python_version(),
                         "msgspec": msgspec.__version__, "chromium": chromium_version() if browser else None},
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_start": load_start,
                        "loadavg_end": os.getloadavg()},
            "notes": "95% CI over repetitions (Student t); the machine is shared, see loadavg.",
            "provenance": prov.finish(),
        }
    finally:
        if browser:
            browser.close()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for k, v in result["figures_s"].items():
        ci = v["ci95"]
        print(f"{k:>24}: {v['mean']:.3f} s" + (f"  [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
