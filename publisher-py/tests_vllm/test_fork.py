"""``vllm serve``-style process start: a parent that loaded the plugins (the
API server) forks the engine-core process, which builds the scheduler. Only
the engine process may publish; the parent must create no file and no thread.

Runs in a fresh interpreter so that the parent has never imported the
scheduler module (as in vLLM's API server), which exercises the plugin's
wrap-on-first-import path in the forked child.
"""

import os
import subprocess
import sys
import tempfile
import textwrap

PARENT = textwrap.dedent(
    """
    import multiprocessing, os, sys, threading
    sys.path.insert(0, {here!r})
    from vllm_harness import build_scheduler, drive, make_requests, set_cpu_environment
    set_cpu_environment()
    import engine_state

    state_dir = {state_dir!r}
    def tasks():
        return sorted(open(f"/proc/self/task/{{t}}/comm").read().strip()
                      for t in os.listdir("/proc/self/task"))
    def files():
        return sorted(os.listdir(state_dir)) if os.path.isdir(state_dir) else []

    import vllm.plugins
    def no_new_thread():
        # Python threads unchanged; native threads (the publisher's heartbeat is
        # "es-heartbeat-*") not more than before: vLLM's imports may end one.
        now = tasks()
        return (threading.active_count() == threads_before and len(now) <= len(tasks_before)
                and not any(name.startswith("es-") for name in now), (threading.enumerate(), now))

    threads_before, tasks_before = threading.active_count(), tasks()
    vllm.plugins.load_general_plugins()
    assert "engine_state.vllm" in sys.modules, "the plugin was not loaded"
    assert "vllm.v1.core.sched.scheduler" not in sys.modules, "the plugin imported the scheduler"
    ok, detail = no_new_thread(); assert ok, ("thread at plugin load", detail)
    assert files() == [], files()

    def engine_core(conn):
        scheduler, _ = build_scheduler(False)
        hook = scheduler.__dict__["_engine_state_hook"]
        drive(scheduler, make_requests(prompt_lens=(30, 20), max_tokens=2), 1)
        scheduler.add_request(make_requests(prompt_lens=(50,), max_tokens=1000, prefix="x")[0])
        scheduler.schedule()
        conn.send((os.getpid(), hook.engine_id))
        conn.recv()
        scheduler.shutdown()
        conn.send("done")

    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    child = context.Process(target=engine_core, args=(theirs,), daemon=True)
    child.start()
    if not ours.poll(150):
        child.kill()
        sys.exit("the engine process did not start its scheduler within 150 s")
    child_pid, engine_id = ours.recv()
    assert child_pid != os.getpid()
    [state] = engine_state.Reader().read()
    assert state.engine_id == engine_id and engine_id.endswith(f"-dp0-{{child_pid}}"), engine_id
    assert state.fresh and state.num_running == 1 and state.step > 0, state
    assert files() == [engine_id], files()
    ok, detail = no_new_thread(); assert ok, ("thread in the parent", detail)
    ours.send("shut down")
    assert ours.recv() == "done"
    child.join(60)
    assert child.exitcode == 0, child.exitcode
    assert files() == [] and engine_state.Reader().read() == [], files()
    ok, detail = no_new_thread(); assert ok, ("thread in the parent", detail)
    print("OK", os.getpid(), child_pid, engine_id)
    """
)


def test_only_the_forked_engine_process_publishes():
    state_dir = tempfile.mkdtemp(prefix="engine-state-vllm-fork-")
    os.rmdir(state_dir)  # the engine process creates it
    script = PARENT.format(here=os.path.dirname(__file__), state_dir=state_dir)
    env = dict(os.environ, AGENTIC_ENGINE_STATE_URI=f"file://{state_dir}", VLLM_PLUGINS="engine_state")
    env.pop("AGENTIC_WORKER_ID", None)
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr[-4000:]
