"""What a user of the apache-spark provider runs today: a spark-submit'ed script that calls
horovod.spark.run for the function (bench/operator_task.py compares our operator with it)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cloudpickle  # noqa: E402
import horovod.spark  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import workloads  # noqa: E402

cloudpickle.register_pickle_by_value(workloads)
try:  # horovod.spark pickles with pyspark's own cloudpickle
    from pyspark import cloudpickle as pyspark_cloudpickle

    pyspark_cloudpickle.register_pickle_by_value(workloads)
except (ImportError, AttributeError):
    pass

spark = SparkSession.builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
results = horovod.spark.run(workloads.hvd_allreduce, num_proc=2, use_gloo=True, verbose=0)
print("horovod.spark.run returned", results[0], flush=True)
spark.stop()
