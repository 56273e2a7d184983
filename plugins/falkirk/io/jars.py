"""The JVM parts falkirk loads, fetched from Maven Central by ``bin/setup``.

Two sets, each declared by a pom in ``jvm/`` and copied into its own folder under
``jvm/lib/`` (ignored by git):

* ``spark``: Spark's Kafka connector and delta-spark, given to every driver and executor
  with ``spark.jars`` (never Ivy resolution at job start: a job starts without network);
* ``kafka``: Apache Kafka's broker, run in KRaft mode as the embedded broker.

``bin/setup`` writes ``.pom.sha256`` beside the jars once the copy is complete; a folder
without it, or whose pom changed since, or with a jar that is not a readable archive, is
refused here with the command that repairs it.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from functools import cache
from pathlib import Path

from falkirk.errors import FalkirkError

JVM_DIR = Path(__file__).resolve().parents[3] / "jvm"
STAMP = ".pom.sha256"
SETS = ("spark", "kafka")


class JarsError(FalkirkError):
    """The JVM jars are missing, stale or corrupt: ``bin/setup`` fetches them."""


def lib_dir() -> Path:
    """Where the jar folders live (``FALKIRK_JARS_DIR`` overrides ``jvm/lib``)."""
    return Path(os.environ.get("FALKIRK_JARS_DIR") or JVM_DIR / "lib")


def pom_digest(name: str) -> str:
    return hashlib.sha256((JVM_DIR / name / "pom.xml").read_bytes()).hexdigest()


@cache
def _checked(folder: Path, digest: str) -> tuple[str, ...]:
    if not folder.is_dir():
        raise JarsError(f"no JVM jars in {folder}: run bin/setup (it fetches them from Maven "
                        "Central)")
    stamp = folder / STAMP
    if not stamp.exists() or stamp.read_text().strip() != digest:
        raise JarsError(f"the jars in {folder} do not match jvm/{folder.name}/pom.xml "
                        "(incomplete fetch, or the pom changed): run bin/setup")
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not jars:
        raise JarsError(f"{folder} holds no jar: run bin/setup")
    for jar in jars:
        try:
            with zipfile.ZipFile(jar):  # reads the central directory: a cut download fails
                pass
        except (zipfile.BadZipFile, OSError) as exc:
            raise JarsError(f"{jar} is corrupt ({exc}): delete {folder} and run "
                            "bin/setup") from exc
    return tuple(jars)


def jars(name: str) -> list[str]:
    """The jar files of one set (``spark`` or ``kafka``), checked; see the module doc."""
    if name not in SETS:
        raise ValueError(f"unknown jar set {name!r} (known: {', '.join(SETS)})")
    return list(_checked(lib_dir() / name, pom_digest(name)))


def spark_jars() -> str:
    """The ``spark.jars`` value: comma-separated paths of the Spark set."""
    return ",".join(jars("spark"))


def kafka_classpath() -> str:
    """The ``java -cp`` value for the Kafka broker."""
    return os.pathsep.join(jars("kafka"))
