"""mpirun's --tag-output tags chunks, not lines: our split must give each rank its whole lines."""

from airflow_provider_hvd.runner.task.mpi_output import TaggedLines


def test_a_line_split_across_chunks_of_two_ranks_comes_back_whole():
    # Seen for real under load: rank 0's line without its newline, then rank 1's chunk, then rank 0's "\n".
    lines = TaggedLines()
    got = []
    for raw in ["[1,0]<stdout>:stdout line from rank 0[1,1]<stdout>:stdout line from rank 1\n",
                "[1,0]<stdout>:\n",
                "[1,1]<stderr>:warning: x\n",
                "--------------------------------------------------\n",
                "[1,0]<stdout>:a[1,0]<stdout>:b\n"]:
        got += lines.feed(raw)
    assert got == [(1, "stdout", "stdout line from rank 1"),
                   (0, "stdout", "stdout line from rank 0"),
                   (1, "stderr", "warning: x"),
                   (None, "mpirun", "--------------------------------------------------"),
                   (0, "stdout", "ab")]


def test_streams_of_one_rank_are_kept_apart():
    lines = TaggedLines()
    assert lines.feed("[1,0]<stdout>:out-[1,0]<stderr>:err\n") == [(0, "stderr", "err")]
    assert lines.feed("[1,0]<stdout>:end\n") == [(0, "stdout", "out-end")]


# mpirun's stderr when the orted it started on 127.0.0.2 died in hwloc (issue 23), as our rsh agent
# relays it: orted's own backtrace, the agent's report line, then mpirun's help text.
ORTED_CRASH = [
    "[host:12345] *** Process received signal ***",
    "[host:12345] Signal: Segmentation fault (11)",
    "[host:12345] Signal code: Address not mapped (1)",
    "[host:12345] [ 1] /lib/x86_64-linux-gnu/libhwloc.so.15(hwloc_alloc_setup_object+0x9e)",
    "[host:12345] [ 7] /lib/x86_64-linux-gnu/libhwloc.so.15(hwloc_shmem_topology_write+0xf9)",
    'HVD-MPI-DAEMON-DIED:{"host": "127.0.0.2", "signal": "SIGSEGV", "code": 139}',
    "ORTE was unable to reliably start one or more daemons.",
]


def test_an_orted_crash_is_reported_as_open_mpis_with_its_own_lines():
    from airflow_provider_hvd.runner.task.mpi_output import failure_report

    report = failure_report(1, ORTED_CRASH, {}, mpirun_host="127.0.0.3")
    assert report["daemon"] == {"process": "orted", "host": "127.0.0.2", "signal": "SIGSEGV", "code": 139}
    assert "<mpirun> [host:12345] Signal: Segmentation fault (11)" in report["tail"]
    assert not any("HVD-MPI-DAEMON-DIED" in line for line in report["tail"])


def test_mpirun_crashing_itself_is_named_but_being_stopped_is_not_a_crash():
    from airflow_provider_hvd.runner.task.mpi_output import failure_report

    crashed = failure_report(-11, ["Segmentation fault"], {}, mpirun_host="127.0.0.3")
    assert crashed["daemon"] == {"process": "mpirun", "host": "127.0.0.3", "signal": "SIGSEGV", "code": -11}
    assert "daemon" not in failure_report(-15, [], {}, mpirun_host="127.0.0.3")  # our own stop
    assert "daemon" not in failure_report(-9, [], {}, mpirun_host="127.0.0.3")   # a lost executor, OOM


def test_the_rsh_agent_reads_a_crash_from_the_shells_exit_code():
    from airflow_provider_hvd.runner.task.rsh_agent import _signal_of

    assert (_signal_of(139), _signal_of(-11), _signal_of(134)) == ("SIGSEGV", "SIGSEGV", "SIGABRT")
    assert (_signal_of(0), _signal_of(1), _signal_of(70)) == (None, None, None)
