"""The runner core: launch, rendezvous, payload, logs. Knows nothing of Airflow.

A run spans three kinds of process, and the folders say which module runs where:

  run              HorovodRunner: the public entry point, in the driver
  spark_app        the Spark application HorovodRunnerOperator submits (a driver process)
  checkpoint       save/latest/load checkpoints: rank 0 writes, anyone reads
  timeline_window  a user's tool: cut a time window out of a timeline too large for the viewer
  errors           the exceptions a user can catch
  defaults         every default of a run, and the np check, once

  driver/          the Spark driver (a notebook, a script, or spark_app)
    service          the driver's end of every channel: payload, roster, logs, results, failures
    monitor          turns the service's events into progress, rank 0's result or an error
    run_failures     the errors a run ends with, in words
    roster           barrier tasks learn every task's host from the driver (one round trip)
    kv_store         gloo's rendezvous store, reached through the run's channel only
    barrier_job      np > 0: the Spark barrier stage, in a thread and job group of its own
    cluster          the cluster's kind, free slots and worker Python, checked in seconds
    pyspark_internals  the private pyspark APIs used, each with why
    launcher_choice  mpi or gloo
    local_launch     np < 0: the barrier layer's launchers, run by the driver itself
    dependencies     the top-level modules a call needs on the workers
    worker_diagnosis a worker whose Python cannot run ranks, in words
    timeline_publisher  rank 0's timeline: a bounded live view each interval, the complete file once
    restart_policy   which failures max_restarts restarts: one table
    run_checkpoints  a run's checkpoint folder as its restarts see it: resume point, partial files

  barrier/         a barrier task on an executor (and, for np < 0, the driver's launcher threads)
    entry            the stage's entry point, shipped by value: checks the worker's Python first
    barrier_task     joins the roster; starts its rank (gloo) or serves mpirun (mpi)
    roster_member    the task's side of the roster
    rank_process     starts one rank, streams its output, reports its end (gloo, and local mode)
    rendezvous_proxy gloo's rendezvous on loopback, forwarded over the launcher's channel
    mpi_run          launcher="mpi": mpirun for every rank
    mpi_output       mpirun's tagged output -> per-rank lines; who ended the job, how
    rsh_service      starts orted on this host for mpirun's agent (holders of the secret only)
    rsh_agent        the agent mpirun runs instead of ssh (a process of its own)
    driver_link      a launcher's channel to the driver: reports up, STOP down, timeline chunks
    timeline_tail    reads rank 0's timeline as it grows
    addresses        which address ranks use to reach the driver, which interface gloo binds
    gpus             Spark-assigned GPUs -> CUDA_VISIBLE_DEVICES
    worker_daemon    PySpark's worker daemon, pyspark imported from its installation

  rank/            each rank process (a fresh interpreter)
    main             verify, unpickle, call, send the result
    context          log_to_driver, current_rank
    stall            reports collectives pending past stall_timeout
    keras_guard      keeps Keras 3 away from horovod's optimizer

  wire/            what the processes say to each other
    channel          authenticated, framed TCP
    messages         every op, stream and event, and each message as a declared type
    hellos           the first frame of every connection: who the peer is
    launch           the task spec, the launch environment, the modules processes start by
    driver_log       the shipped driver output's chunks and heartbeat (read by the Airflow side)
    payload          HMAC-signed cloudpickle envelopes for the call and its result

  common/          plain helpers every process may use
    lifetime         processes die with their parent (PR_SET_PDEATHSIG)
    processes        kill a process tree; describe one that hangs
    storage          atomic, streamed writes to a path or fsspec URL
    checkpoint_files ckpt-<step>.pt names, and the complete checkpoints in a folder
    rank_slots       rank/local_rank/cross_rank assignment, host by host
    installed_pyspark  pyspark and py4j from their compiled installation, not Spark's zips

Imports go down only: the entry points above may use driver/, which may use barrier/, which
may use nothing but wire/ and common/; rank/ too uses only wire/ and common/.
tests/test_layout.py keeps it so.
"""
