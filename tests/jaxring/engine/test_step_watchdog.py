"""The step watchdog (jaxring/engine/step_watchdog.py): it ends the job when a step stops making progress,
and only then; its job-wide use under mpirun is in test_sync_mpi4jax.py."""

import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import pytest

from jaxring.engine.step_watchdog import StepWatchdog


class Loss:
    """A step's loss that is ready once `done` is set."""

    def __init__(self, done=False):
        self.done = done

    def is_ready(self):
        return self.done


def queue(dog, loss):
    """A step dispatched under the watchdog, returning `loss`."""
    return dog.step(lambda: (None, {"loss": loss}))


def watchdog(timeout_s):
    ended = threading.Event()
    messages = []
    dog = StepWatchdog(rank=3, why="the reason", timeout_s=timeout_s,
                       end=lambda message: (messages.append(message), ended.set()))
    return dog, ended, messages


def test_a_step_that_never_finishes_ends_the_job_with_words():
    dog, ended, messages = watchdog(0.2)
    queue(dog, Loss(done=True))
    queue(dog, Loss())
    assert ended.wait(30), "the watchdog never ended the job"
    assert messages == ["rank 3: a training step has not finished in 0.2 s (JAXRING_TIMEOUT_S): the reason. "
                        "A process of the job stopped or is stuck; ending the job."]


def test_steps_that_finish_in_turn_are_left_alone():
    """Queued steps finishing one after another, each within the timeout, however long the queue takes."""
    dog, ended, _ = watchdog(2.0)
    steps = [Loss() for _ in range(6)]
    for step in steps:
        queue(dog, step)
    for step in steps:  # 6 x 0.5 s in all: more than the timeout, but each finishes within it of the last
        time.sleep(0.5)
        step.done = True
    queue(dog, jnp.arange(3.0) * 2)  # a real step's output
    assert not ended.wait(1.0)


def test_a_dispatch_that_never_returns_ends_the_job():
    """The host can wait inside the call that queues a step, before any output exists."""
    dog, ended, _ = watchdog(0.2)
    queue(dog, Loss(done=True))
    threading.Thread(target=dog.step, args=(threading.Event().wait,), daemon=True).start()
    assert ended.wait(30), "the watchdog never ended the job"


def test_the_first_steps_compilation_is_not_timed():
    """The first call compiles (each process in its own time): its step is watched once the call returns."""
    dog, ended, _ = watchdog(0.2)
    first = Loss()
    dog.step(lambda: (time.sleep(1.0), (None, {"loss": first}))[1])  # five timeouts in the call
    first.done = True
    assert not ended.wait(1.0)
    queue(dog, Loss())  # and the steps after it are watched
    assert ended.wait(30), "the watchdog never ended the job"


def test_an_infinite_timeout_watches_nothing_and_a_bad_one_is_refused():
    dog, _, _ = watchdog(float("inf"))
    queue(dog, Loss())
    assert dog._thread is None
    with pytest.raises(ValueError, match="positive number of seconds"):
        watchdog(0)


def test_the_thread_is_stopped_before_python_ends_its_daemon_threads(tmp_path):
    # A daemon thread still polling at exit is ended inside jaxlib's is_ready, which aborts the process;
    # the watchdog's atexit handler stops it first. The check registered before it runs after it (LIFO).
    script = tmp_path / "exit_while_watching.py"
    script.write_text(
        "import atexit, time\n"
        "from jaxring.engine.step_watchdog import StepWatchdog\n"
        "class Slow:\n"
        "    def is_ready(self):\n"
        "        time.sleep(0.05)\n"
        "        return False\n"
        "dog = StepWatchdog(0, 'test', timeout_s=60, end=print)\n"
        "atexit.register(lambda: print('alive at exit:', dog._thread.is_alive()))\n"
        "dog.step(lambda: (None, {'loss': Slow()}))\n"
        "time.sleep(0.3)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "alive at exit: False"


def test_stopping_waits_for_a_hung_poll_only_so_long():
    class Hung:
        def is_ready(self):
            time.sleep(3)
            return False

    dog, _, _ = watchdog(0.5)
    queue(dog, Hung())
    time.sleep(0.2)  # the thread's first poll (every 0.05 s) is under way and hangs
    began = time.monotonic()
    dog.stop(timeout_s=0.3)
    assert time.monotonic() - began < 2 and dog._thread.is_alive()
