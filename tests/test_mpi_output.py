"""mpirun's --tag-output tags chunks, not lines: our split must give each rank its whole lines."""

from airflow_provider_hvd.runner.barrier.mpi_output import TaggedOutput
from airflow_provider_hvd.runner.barrier.output_lines import LineAssembler
from airflow_provider_hvd.runner.wire.messages import DaemonDeath


class Lines:
    """mpirun's output read in the given chunks -> (rank, stream, line) as the mpi launcher shows them."""

    def __init__(self):
        self.tagged, self.assemblers, self.got = TaggedOutput(), {}, []

    def feed(self, data, final=False):
        for key, text in self.tagged.feed(data, final=final):
            if key not in self.assemblers:
                rank, stream = key if key else (None, "mpirun")
                self.assemblers[key] = LineAssembler(lambda line, r=rank, s=stream: self.got.append((r, s, line)))
            self.assemblers[key].feed(text)
        return self


def test_a_line_split_across_chunks_of_two_ranks_comes_back_whole():
    # Seen for real under load: rank 0's line without its newline, then rank 1's chunk, then rank 0's "\n".
    lines = Lines()
    for raw in ["[1,0]<stdout>:stdout line from rank 0[1,1]<stdout>:stdout line from rank 1\n",
                "[1,0]<stdout>:\n",
                "[1,1]<stderr>:warning: x\n",
                "--------------------------------------------------\n",
                "[1,0]<stdout>:a[1,0]<stdout>:b\n"]:
        lines.feed(raw)
    assert lines.got == [(1, "stdout", "stdout line from rank 1"),
                         (0, "stdout", "stdout line from rank 0"),
                         (1, "stderr", "warning: x"),
                         (None, "mpirun", "--------------------------------------------------"),
                         (0, "stdout", "ab")]


def test_streams_of_one_rank_are_kept_apart():
    lines = Lines().feed("[1,0]<stdout>:out-[1,0]<stderr>:err\n")
    assert lines.got == [(0, "stderr", "err")]
    assert lines.feed("[1,0]<stdout>:end\n").got[-1] == (0, "stdout", "out-end")


def test_a_tag_cut_by_a_read_is_joined_with_its_rest():
    # Reads end anywhere: in the middle of "[1,1]<stderr>:", even right after its "[".
    data = "[1,0]<stdout>:one[1,1]<stderr>:two\n[1,0]<stdout>:\n[1,1]<stdout>:[not a tag] three\n"
    for cut in range(1, len(data)):
        lines = Lines().feed(data[:cut]).feed(data[cut:])
        assert lines.got == [(1, "stderr", "two"), (0, "stdout", "one"), (1, "stdout", "[not a tag] three")], cut


def test_text_that_only_looks_like_the_start_of_a_tag_is_kept_at_the_end():
    lines = Lines().feed("[1,0]<stdout>:progress [1").feed("", final=True)
    lines.assemblers[(0, "stdout")].close()
    assert lines.got == [(0, "stdout", "progress [1")]


def test_redrawn_chunks_of_two_ranks_as_mpirun_forwards_them():
    # What Open MPI 4.1 wrote for two ranks drawing a bar on stderr (each chunk tagged, no newline).
    lines = Lines()
    for raw in ["[1,0]<stderr>:\r0% |[1,1]<stderr>:\r0% |", "[1,0]<stderr>:\r20% |#", "[1,1]<stderr>:\r20% |#",
                "[1,0]<stderr>:\r100% done\n", "[1,0]<stdout>:after\n[1,0]<stdout>:partial",
                "[1,1]<stderr>:\r100% done\n[1,1]<stdout>:after\n[1,1]<stdout>:partial",
                "[1,0]<stdout>: rest\n", "[1,1]<stdout>: rest\n"]:
        lines.feed(raw)
    for rank in (0, 1):
        mine = [(s, line) for r, s, line in lines.got if r == rank]
        # The first state is shown at once (nothing shown for a second), the final one when the bar ends.
        assert mine == [("stderr", "0% |"), ("stderr", "100% done"), ("stdout", "after"), ("stdout", "partial rest")]


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
    from airflow_provider_hvd.runner.barrier.mpi_output import failure_report

    report = failure_report(1, ORTED_CRASH, {}, mpirun_host="127.0.0.3")
    assert report.daemon == DaemonDeath(process="orted", host="127.0.0.2", signal="SIGSEGV", code=139)
    assert "<mpirun> [host:12345] Signal: Segmentation fault (11)" in report.tail
    assert not any("HVD-MPI-DAEMON-DIED" in line for line in report.tail)


def test_mpirun_crashing_itself_is_named_but_being_stopped_is_not_a_crash():
    from airflow_provider_hvd.runner.barrier.mpi_output import failure_report

    crashed = failure_report(-11, ["Segmentation fault"], {}, mpirun_host="127.0.0.3")
    assert crashed.daemon == DaemonDeath(process="mpirun", host="127.0.0.3", signal="SIGSEGV", code=-11)
    assert failure_report(-15, [], {}, mpirun_host="127.0.0.3").daemon is None  # our own stop
    assert failure_report(-9, [], {}, mpirun_host="127.0.0.3").daemon is None   # a lost executor, OOM


def test_the_rsh_agent_reads_a_crash_from_the_shells_exit_code():
    from airflow_provider_hvd.runner.barrier.rsh_agent import _signal_of

    assert (_signal_of(139), _signal_of(-11), _signal_of(134)) == ("SIGSEGV", "SIGSEGV", "SIGABRT")
    assert (_signal_of(0), _signal_of(1), _signal_of(70)) == (None, None, None)


def test_daemons_that_never_started_keep_what_was_said_before_open_mpis_help_text():
    from airflow_provider_hvd.runner.barrier.mpi_output import failure_report

    said = ["rsh_agent: the barrier task on 127.0.0.3 went away",
            "--------------------------------------------------------------------------",
            "ORTE was unable to reliably start one or more daemons.",
            "This usually is caused by:", *[f"help line {i}" for i in range(20)]]
    report = failure_report(213, said, {}, mpirun_host="127.0.0.2")
    assert "<mpirun> rsh_agent: the barrier task on 127.0.0.3 went away" in report.tail
