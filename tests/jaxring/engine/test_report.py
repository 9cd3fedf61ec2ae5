"""The run's last line: the task's hook or the engine's default, then devices, processes, all-reduce share, time."""

from jaxring.engine.report import final_report
from jaxring.engine.task import MetricNames

SUMMARY = {"dev_err": 0.25, "dev_miss": 0.5, "test_err": 0.125, "test_miss": 0.0625, "best_step": 30,
           "local_devices": 2, "processes": 3, "allreduce": "ring",
           "last_window_allreduce_share_estimate": 0.054, "train_seconds": 407.4}


class Plain:
    metrics = MetricNames(best="miss", plotted=("err",), shown=("err",), percent=("err", "miss"))


class Hooked(Plain):
    def final_report(self, config, workdir, summary):
        assert config == "CONFIG" and workdir == "RUN" and summary["test_err"] == 0.125
        return {"test_slow_err": 0.1}, "slow decoder: 10%"


def test_without_a_hook_the_line_shows_the_tasks_metrics():
    summary, line = final_report(Plain(), "CONFIG", "RUN", SUMMARY, "cpu")
    assert summary == SUMMARY
    assert line == ("test err 12.50%, miss 6.25%; dev err 25.00%, miss 50.00% (checkpoint of step 30); "
                    "trained on 2 cpu devices x 3 processes, ring all-reduce 5.4% of the step; 407 s; run directory RUN")


def test_each_metric_is_written_as_the_task_declares_it_and_shown_ones_are_included():
    # A language model's bits per character and perplexity are not rates; its error rate is.
    class LanguageModel:
        metrics = MetricNames(best="bits_per_char", plotted=("bits_per_char",), shown=("perplexity", "error_rate"),
                              percent=("error_rate",))

    summary = {**SUMMARY, "test_bits_per_char": 3.6673, "test_perplexity": 12.706, "test_error_rate": 0.6507,
               "dev_bits_per_char": 3.701, "dev_perplexity": 13.0, "dev_error_rate": 0.66}
    _, line = final_report(LanguageModel(), None, "RUN", summary, "cpu")
    assert line.startswith("test bits_per_char 3.667, perplexity 12.71, error_rate 65.07%; "
                           "dev bits_per_char 3.701, perplexity 13, error_rate 66.00% (checkpoint of step 30); ")


def test_the_hooks_scores_join_the_summary_and_its_text_begins_the_line():
    summary, line = final_report(Hooked(), "CONFIG", "RUN", SUMMARY, "gpu")
    assert summary == {**SUMMARY, "test_slow_err": 0.1}
    assert line.startswith("slow decoder: 10%; trained on 2 gpu devices x 3 processes, ring all-reduce 5.4% ")


def test_one_replica_and_a_resumed_run_without_the_earlier_time():
    one = {**SUMMARY, "local_devices": 1, "processes": 1, "allreduce": "psum", "train_seconds": None,
           "train_seconds_since_resume": 12.0}
    del one["test_err"], one["test_miss"]
    _, line = final_report(Plain(), None, "RUN", one, "cpu")
    assert line == ("dev err 25.00%, miss 50.00% (checkpoint of step 30); trained on 1 cpu device x 1 process, "
                    "psum all-reduce over one replica (no exchange); 12 s since the resume; run directory RUN")


def test_nine_replicas_are_an_exchange_and_the_share_is_rounded_to_a_tenth_of_a_percent():
    # 3 devices x 3 processes: a ratio of 1, but nine replicas; a 75% share must not read as 75.1%.
    nine = {**SUMMARY, "local_devices": 3, "processes": 3, "last_window_allreduce_share_estimate": 0.75}
    _, line = final_report(Plain(), None, "RUN", nine, "gpu")
    assert "; trained on 3 gpu devices x 3 processes, ring all-reduce 75.0% of the step; 407 s;" in line
    small = {**SUMMARY, "last_window_allreduce_share_estimate": 0.0041}
    assert "ring all-reduce 0.4% of the step" in final_report(Plain(), None, "RUN", small, "cpu")[1]


def test_the_line_says_what_carried_the_average_across_processes():
    # train.across_processes mpi4jax: the ring (or psum) over each process' devices, then mpi4jax
    mpi4jax = {**SUMMARY, "across_processes": "mpi4jax"}
    assert ("; trained on 2 cpu devices x 3 processes, ring all-reduce over each process' devices, then mpi4jax "
            "all-reduce across processes 5.4% of the step; " in final_report(Plain(), None, "RUN", mpi4jax, "cpu")[1])
    one_device = {**mpi4jax, "local_devices": 1, "allreduce": "psum"}
    assert ("; trained on 1 cpu device x 3 processes, mpi4jax all-reduce across processes 5.4% of the step; "
            in final_report(Plain(), None, "RUN", one_device, "cpu")[1])
    jaxrings = {**SUMMARY, "across_processes": "jaxring"}  # its ring crosses processes too, through its MPI leg
    assert final_report(Plain(), None, "RUN", jaxrings, "cpu")[1] == final_report(Plain(), None, "RUN", SUMMARY, "cpu")[1]
