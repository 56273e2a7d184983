"""The JVM parts falkirk loads, fetched from Maven Central at set-up.

Four sets, each declared by a pom shipped in the package (``falkirk/jvm/<set>/pom.xml``)
and copied by ``falkirk jars`` (which ``bin/setup`` runs) into its own folder of the jar
folder: ``jvm/lib/`` in a checkout, ``$FALKIRK_HOME/jvm/lib`` for an installed wheel,
``$FALKIRK_JARS_DIR`` when set:

* ``spark``: Spark's Kafka connector and delta-spark, given to every driver and executor
  with ``spark.jars`` (never Ivy resolution at job start: a job starts without network);
* ``kafka``: Apache Kafka's broker, run in KRaft mode as the embedded broker;
* ``s3``: hadoop-aws and the AWS SDK, on the class path of drivers and executors of a
  profile whose lake is on an object store (``s3a://``);
* ``objectstore``: S3Proxy, the object store of the local cluster (``bin/cluster``).

A complete copy gets ``.pom.sha256`` beside its jars: the pom's digest, then each jar's
size, written once every jar was read as an archive. A folder without it, or whose pom
changed since, or with a jar missing or of another size (a cut download), is refused here
with the command that repairs it. Use reads only the stamp and the sizes: every Airflow
task parses the DAG file, which computes the Spark settings, and opening the 650 MB AWS
SDK bundle's archive index there took over the 30 s parse timeout on a loaded machine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from functools import cache
from pathlib import Path

from falkirk.config import CHECKOUT, STATE_DIR
from falkirk.errors import FalkirkError

JVM_DIR = Path(__file__).resolve().parents[1] / "jvm"  # the poms, shipped in the wheel
STAMP = ".pom.sha256"
SETS = ("spark", "kafka", "s3", "objectstore")
#: What repairs the jar folder: bin/setup in a checkout, the verb itself for a wheel.
REPAIR = "bin/setup" if CHECKOUT else "falkirk jars"


class JarsError(FalkirkError):
    """The JVM jars are missing, stale or corrupt: ``falkirk jars`` fetches them."""


def lib_dir() -> Path:
    """Where the jar folders live (``FALKIRK_JARS_DIR`` overrides the default)."""
    default = CHECKOUT / "jvm" / "lib" if CHECKOUT else STATE_DIR / "jvm" / "lib"
    return Path(os.environ.get("FALKIRK_JARS_DIR") or default)


def pom(name: str) -> Path:
    return JVM_DIR / name / "pom.xml"


def pom_digest(name: str) -> str:
    return hashlib.sha256(pom(name).read_bytes()).hexdigest()


def _verified(folder: Path, digest: str) -> str:
    """Read every jar as an archive (its central directory: a cut download fails) and
    return the stamp that records the pom's digest and each jar's size."""
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise JarsError(f"{folder} holds no jar: run {REPAIR}")
    for jar in jars:
        try:
            with zipfile.ZipFile(jar):
                pass
        except (zipfile.BadZipFile, OSError) as exc:
            raise JarsError(f"{jar} is corrupt ({exc}): delete {folder} and run "
                            f"{REPAIR}") from exc
    return "\n".join([digest, *(f"{jar.stat().st_size} {jar.name}" for jar in jars)]) + "\n"


@cache
def _checked(folder: Path, digest: str) -> tuple[str, ...]:
    if not folder.is_dir():
        raise JarsError(f"no JVM jars in {folder}: run {REPAIR} (it fetches them from Maven "
                        "Central)")
    stamp = folder / STAMP
    lines = stamp.read_text().splitlines() if stamp.exists() else []
    if not lines or lines[0].strip() != digest:
        raise JarsError(f"the jars in {folder} do not match falkirk/jvm/{folder.name}/pom.xml "
                        f"(incomplete fetch, or the pom changed): run {REPAIR}")
    sizes = {name: int(size) for size, name in (line.split(" ", 1) for line in lines[1:])}
    if not sizes:  # stamped by an older falkirk: read the archives (once per process)
        _verified(folder, digest)
        return tuple(sorted(str(p) for p in folder.glob("*.jar")))
    found = {p.name for p in folder.glob("*.jar")}
    for name, size in sizes.items():
        jar = folder / name
        if name not in found or jar.stat().st_size != size:
            raise JarsError(f"{jar} is corrupt (missing, or not the {size} bytes fetched): "
                            f"delete {folder} and run {REPAIR}")
    extra = sorted(found - set(sizes))
    if extra:
        raise JarsError(f"{folder} holds jars not fetched for its pom ({', '.join(extra)}): "
                        f"delete {folder} and run {REPAIR}")
    return tuple(str(folder / name) for name in sorted(sizes))


def fetch(name: str) -> bool:
    """Copy one set's jars from Maven Central (``mvn dependency:copy-dependencies``) into
    its folder, unless a complete copy of this pom is there; True when it fetched."""
    folder = lib_dir() / name
    digest = pom_digest(name)
    stamp = folder / STAMP
    lines = stamp.read_text().splitlines() if stamp.exists() else []
    if lines and lines[0].strip() == digest:
        if len(lines) == 1:  # complete, stamped by an older falkirk: add the sizes
            stamp.write_text(_verified(folder, digest))
            _checked.cache_clear()
        return False
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("Maven (mvn) is not installed: it fetches the JVM jars from Maven "
                        "Central (Debian: apt-get install maven)")
    shutil.rmtree(folder, ignore_errors=True)
    done = subprocess.run([mvn, "-q", "-B", "-f", str(pom(name)),
                           "dependency:copy-dependencies",
                           f"-DoutputDirectory={folder.resolve()}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise JarsError(f"mvn could not fetch the {name} jars of {pom(name)} "
                        f"(exit {done.returncode}):\n{tail}")
    stamp.write_text(_verified(folder, digest))
    _checked.cache_clear()
    return True


def jars(name: str) -> list[str]:
    """The jar files of one set (one of ``SETS``), checked; see the module doc."""
    if name not in SETS:
        raise ValueError(f"unknown jar set {name!r} (known: {', '.join(SETS)})")
    return list(_checked(lib_dir() / name, pom_digest(name)))


def spark_jars() -> str:
    """The ``spark.jars`` value: comma-separated paths of the Spark set."""
    return ",".join(jars("spark"))


def kafka_classpath() -> str:
    """The ``java -cp`` value for the Kafka broker."""
    return os.pathsep.join(jars("kafka"))


def s3_classpath() -> str:
    """The class path entries that let Spark reach ``s3a://`` (hadoop-aws, the AWS SDK)."""
    return os.pathsep.join(jars("s3"))


def objectstore_jar() -> str:
    """S3Proxy's self-contained jar (``java -jar``)."""
    [jar] = jars("objectstore")
    return jar
