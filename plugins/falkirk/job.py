"""The interface a pipeline's Spark job is written against (see docs/jobs.md).

A job module defines pure transforms and a :class:`JobLogic`, and ends with
``main(Logic())``; everything else (reading an epoch's inputs, writing its outputs exactly
once, state, the epoch log) is the runtime's. ``session`` and ``load_job`` serve a job's
unit tests. Jobs import from here only, so the framework's modules can move without
breaking a user's pipeline.
"""

from falkirk.io.spark import conform, cut_lineage, dead_letters, split_checked
from falkirk.model.schemas import arrow_schema, ddl
from falkirk.runtime.driver import main
from falkirk.runtime.job import PASS_COLUMN, EpochContext, EpochResult, JobLogic, load_job
from falkirk.runtime.launcher import session

__all__ = ["PASS_COLUMN", "EpochContext", "EpochResult", "JobLogic", "main", "conform",
           "cut_lineage", "dead_letters", "split_checked", "arrow_schema", "ddl", "session",
           "load_job"]
