"""OpenLineage: the datasets of a pipeline's edges and the run events of its epochs.

Each region's committed epoch is one OpenLineage run (job ``<pipeline>.<region>`` in the
``falkirk`` namespace, a run id derived from pipeline, region, epoch and generation, so the
same commit always names the same run): a COMPLETE event whose inputs are the region's
input topics and tables, whose outputs are the tables and topics it wrote (a table with
the Delta version the epoch committed), and whose ``falkirk`` run facet carries pipeline,
region, epoch and generation. The jobs send them as they commit (``epochs_committed``,
called by the epoch loop); falkirk's Airflow tasks hand the same datasets and facet to
Airflow's OpenLineage provider (falkirk.airflow.assets).

Datasets follow OpenLineage's naming (``openlineage.client.naming``): a table on this
machine is namespace ``file`` and its path, on an object store ``s3://<bucket>`` and its
key; a topic is ``kafka://<first bootstrap host:port>`` and its name. The same place's
Airflow asset URI is the namespace and name joined (:func:`dataset_uri`), so lineage and
assets name a table alike.

Where events go is ``Config.lineage`` (``FALKIRK_LINEAGE``; :func:`falkirk.config.
lineage_transport`): off by default, then nothing here is imported or sent. A lineage
server that does not answer never fails an epoch: the event is dropped with a warning.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from falkirk.config import Config, lineage_transport
from falkirk.model.topology import EdgeSpec, Pipeline

if TYPE_CHECKING:
    from openlineage.client.generated.base import InputDataset, OutputDataset

log = logging.getLogger(__name__)

#: The OpenLineage namespace of falkirk's region jobs.
NAMESPACE = "falkirk"
try:
    _VERSION = version("falkirk")
except PackageNotFoundError:  # a checkout not installed
    _VERSION = "0"
#: Who produced an event (a URI, as OpenLineage asks).
PRODUCER = f"urn:falkirk:{_VERSION}"
#: The ``falkirk`` run facet's schema: plugins/falkirk/schemas/lineage/FalkirkRunFacet.json,
#: shipped in the package.
FACET_SCHEMA_URL = "urn:falkirk:schemas:lineage:FalkirkRunFacet:1"


@cache
def _facet_class() -> type:
    """The ``falkirk`` run facet's class, made on first use: the OpenLineage client takes
    half a second to import, which a job with lineage off does not pay."""
    import attr
    from openlineage.client.generated.base import RunFacet

    @attr.define
    class FalkirkRunFacet(RunFacet):
        """Which epoch of which region a run is, in which generation (every rollback raises
        it); a rollback's run also says what it restated."""

        pipeline: str
        region: str | None = None
        epoch: int | None = None
        generation: int | None = None
        #: a rollback's: {rollback_id, regions: {region: [from_epoch, to_epoch]}}
        restated: dict[str, Any] | None = None

        @staticmethod
        def _get_schema() -> str:
            return FACET_SCHEMA_URL

    return FalkirkRunFacet


def run_facet(pipeline: str, region: str | None = None, epoch: int | None = None,
              generation: int | None = None, restated: dict[str, Any] | None = None) -> Any:
    """The ``falkirk`` run facet (an OpenLineage RunFacet, schema :data:`FACET_SCHEMA_URL`)."""
    return _facet_class()(pipeline, region, epoch, generation, restated, producer=PRODUCER)


def table_dataset(cfg: Config, table: str) -> tuple[str, str]:
    """A Delta table's OpenLineage (namespace, name): the store's."""
    location = cfg.table(table)
    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        return "file", parts.path if parts.scheme else location
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def topic_dataset(cfg: Config, topic: str) -> tuple[str, str]:
    """A Kafka topic's OpenLineage (namespace, name): the first bootstrap server's."""
    first = cfg.kafka_bootstrap.split(",")[0].strip()
    return f"kafka://{first}", topic


def edge_dataset(cfg: Config, edge: EdgeSpec) -> tuple[str, str] | None:
    """The dataset an edge carries, or None for an unlogged edge (records handed over
    inside a job)."""
    if edge.kind == "delta":
        return table_dataset(cfg, edge.table)
    if edge.kind == "kafka":
        return topic_dataset(cfg, edge.topic)
    return None


def dataset_uri(namespace: str, name: str) -> str:
    """One URI for a dataset: its Airflow asset's (``file:///…``, ``s3://bucket/key``,
    ``kafka://host:port/topic``)."""
    if namespace == "file":
        return f"file://{name}"
    return f"{namespace}/{name.lstrip('/')}"


def run_id(pipeline: str, region: str, epoch: int, generation: int) -> str:
    """The run of one region's epoch in one generation: the same every time it is named."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL,
                          f"falkirk:{pipeline}:{region}:{epoch}:{generation}"))


def region_datasets(cfg: Config, pipeline: Pipeline, region: str,
                    inputs: dict | None = None, outputs: dict | None = None
                    ) -> tuple[list[InputDataset], list[OutputDataset]]:
    """A region's input and output datasets; with an epoch log row's ``inputs`` and
    ``outputs``, each Delta one carries the table version read or committed."""
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.generated.dataset_version_dataset import (
        DatasetVersionDatasetFacet,
    )

    def facets(given: dict | None, edge: EdgeSpec) -> dict:
        found = (given or {}).get(edge.name) or {}
        v = found.get("version") if isinstance(found, dict) else None
        return {} if v is None or v < 0 else {
            "version": DatasetVersionDatasetFacet(datasetVersion=str(v))}

    ins: dict[tuple[str, str], InputDataset] = {}
    for edge in pipeline.in_edges(region):
        ds = edge_dataset(cfg, edge)
        if ds is not None and ds not in ins:
            ins[ds] = InputDataset(*ds, inputFacets={}, facets=facets(inputs, edge))
    outs: dict[tuple[str, str], OutputDataset] = {}
    for edge in pipeline.out_edges(region):
        ds = edge_dataset(cfg, edge)
        if ds is not None and ds not in outs:
            outs[ds] = OutputDataset(*ds, outputFacets={}, facets=facets(outputs, edge))
    return list(ins.values()), list(outs.values())


_clients: dict[str, Any] = {}  # setting -> its client, one per process


def client(cfg: Config) -> Any | None:
    """This process's OpenLineage client for ``cfg.lineage``, or None when it is off."""
    transport = lineage_transport(cfg.lineage)
    if transport is None:
        return None
    if cfg.lineage not in _clients:
        from openlineage.client import OpenLineageClient

        _clients[cfg.lineage] = OpenLineageClient(config={"transport": transport})
    return _clients[cfg.lineage]


def epochs_committed(cfg: Config, pipeline: Pipeline, rows: list[Any]) -> int:
    """Send a COMPLETE run event for each committed (or checkpointed) epoch in ``rows``
    (the epoch log rows a job just recorded); the number sent. Nothing when lineage is off;
    a send that fails is a warning, never the epoch's failure."""
    ol = client(cfg)
    if ol is None:
        return 0
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    sent = 0
    for row in rows:
        if row.status not in ("committed", "checkpointed"):
            continue
        inputs, outputs = region_datasets(cfg, pipeline, row.region, row.inputs, row.outputs)
        event = RunEvent(
            eventType=RunState.COMPLETE, eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=run_id(pipeline.name, row.region, row.epoch, row.generation),
                    facets={"falkirk": run_facet(pipeline.name, row.region, row.epoch,
                                                 row.generation)}),
            job=Job(namespace=NAMESPACE, name=f"{pipeline.name}.{row.region}"),
            producer=PRODUCER, inputs=inputs, outputs=outputs)
        try:
            ol.emit(event)
            sent += 1
        except Exception as exc:  # a lineage server away: the epoch is committed all the same
            log.warning("OpenLineage event of %s epoch %d not sent: %s", row.region,
                        row.epoch, exc)
    return sent
