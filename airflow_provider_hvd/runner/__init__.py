"""The runner core: launch, rendezvous, payload, logs. Knows nothing of Airflow.

Module map (one job each):
  horovod_runner  the public ``HorovodRunner`` class: validate, choose a launch, wait
  payload         HMAC-signed cloudpickle envelopes for the call and its result
  channel         authenticated, framed TCP between the driver and ranks/tasks
  driver_service  the driver's end: serves the payload, collects logs, results, failures
  monitor         turns driver-service events into progress, a result or an error
  roster          barrier tasks learn every task's host from the driver (one round trip)
  rendezvous      gloo's key-value rendezvous: store on the driver, authenticated loopback proxy per rank
  stall           each rank reports collectives pending past stall_timeout
  topology        rank/local_rank/cross_rank assignment, host by host
  network         which address and interface ranks use to reach each other
  rank_process    starts one rank as a fresh Python process and reports how it ended
  rank_main       what runs inside that process: verify, unpickle, call, send result
  rank_context    ``log_to_driver`` and what a rank knows about itself
  lifetime        processes die with their parent (PR_SET_PDEATHSIG)
  local_launch    np < 0: ranks as subprocesses of the driver
  spark_launch    np > 0: one Spark barrier stage, one rank per task, under the workers' Python
  worker_check    each barrier task first checks its Python can run a rank (shipped by value)
  dependencies    the top-level modules a call needs on the workers
  mpi_launch      launcher="mpi": mpirun from the barrier stage, rsh agent through the tasks
  mpi_rsh         the rsh agent mpirun calls to start orted on a host
  driver_link     a launcher's channel to the driver: reports, "stop", timeline chunks
  gpus            Spark-assigned GPUs -> CUDA_VISIBLE_DEVICES
  timeline        Horovod Timeline shipped from rank 0 and published as valid Chrome trace
  spark_app       the Spark application the Airflow operator submits
  storage         atomic writes to a path or fsspec URL
  errors          the exceptions a user can catch
  checkpoint      rank-0-only, atomic checkpoints on a path or fsspec URL
"""
