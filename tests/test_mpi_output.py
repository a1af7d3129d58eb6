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
