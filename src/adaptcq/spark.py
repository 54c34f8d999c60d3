"""adaptcq on Apache Spark: any continuous query as a partitioned, checkpointed Structured
Streaming job (docs/spark.md).

>>> from adaptcq.spark import continuous_query, get_spark
>>> spark = get_spark("local[2]")
>>> results = continuous_query(spark, sql, {"R": r_stream_df, "S": s_stream_df}, timestamp="ts")
"""

from adaptcq.runtime.spark import (
    FileJob,
    SparkRun,
    SplitPlan,
    continuous_query,
    plan_split,
    prepare_files,
    run_files,
    signal_end,
    write_batch,
)
from adaptcq.runtime.spark_session import get_spark
from adaptcq.stream.datasource import register as register_data_source

__all__ = ["FileJob", "SparkRun", "SplitPlan", "continuous_query", "get_spark", "plan_split",
           "prepare_files", "register_data_source", "run_files", "signal_end", "write_batch"]
