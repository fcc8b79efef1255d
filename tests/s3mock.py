"""A local S3 for the tests: moto's server on 127.0.0.1 (no credentials leave the machine).

``S3Server`` serves moto's S3 from a thread of the test process. It models what the project relies
on from S3 itself: each request is atomic (a conditional PUT's check and write are one step, as on
S3; moto alone does not promise that between its threads), and, when ``commit_delay`` is set, every
PUT of a Delta commit file (``_delta_log/<version>.json``) waits that long before it reaches the
store, as a slow network would: the window in which a second driver can write the same version.
"""

from __future__ import annotations

import os
import re
import threading
import time

COMMIT_FILE = re.compile(r"/_delta_log/\d{20}\.json$")
ACCESS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


class _Atomic:
    """WSGI middleware: the delay above, then one request at a time into moto for writes."""

    def __init__(self, app):
        self.app = app
        self.commit_delay = 0.0
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "PUT" and self.commit_delay and COMMIT_FILE.search(environ.get("PATH_INFO", "")):
            time.sleep(self.commit_delay)
        if method in ("PUT", "POST", "DELETE"):
            with self.lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


class S3Server:
    def __init__(self):
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        class Quiet(MotoRequestHandler):
            def log_message(self, *args):  # no line per request on the test's stderr
                pass

        import logging

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
        os.environ.update(ACCESS)  # the S3A client's default credential chain reads them
        self.app = _Atomic(DomainDispatcherApplication(create_backend_app))
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True, request_handler=Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        host, port = self.server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"

    @property
    def commit_delay(self) -> float:
        return self.app.commit_delay

    @commit_delay.setter
    def commit_delay(self, seconds: float) -> None:
        self.app.commit_delay = seconds

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(Bucket=name)

    def hadoop_conf(self) -> dict:
        """The S3A settings of this endpoint (no credentials: those come from the environment)."""
        return {"fs.s3a.endpoint": self.endpoint, "fs.s3a.path.style.access": "true",
                "fs.s3a.connection.ssl.enabled": "false", "fs.s3a.endpoint.region": "us-east-1"}

    def spark_conf(self) -> dict:
        return {f"spark.hadoop.{k}": v for k, v in self.hadoop_conf().items()}

    def spark_defaults(self) -> str:
        """A deployment's spark-defaults.conf for spark-submit against this server: the S3A connector's
        JARs on the driver's and the executors' class path (``connector_class_path``: the README's
        command gives ``--jars`` for dpspark's log store, which would replace a ``spark.jars`` here),
        the store for s3a://, the endpoint, and the test credentials."""
        from dpspark.session import EXCLUSIVE_LOG_STORE

        class_path = os.pathsep.join(connector_class_path())
        values = {"spark.driver.extraClassPath": class_path, "spark.executor.extraClassPath": class_path,
                  "spark.delta.logStore.s3a.impl": EXCLUSIVE_LOG_STORE, **self.spark_conf(),
                  "spark.hadoop.fs.s3a.access.key": "testing", "spark.hadoop.fs.s3a.secret.key": "testing"}
        return "".join(f"{key} {value}\n" for key, value in values.items())

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


def _artifact(jar_name: str) -> str:
    """``io.netty_netty-buffer-4.1.126.Final.jar`` (Ivy's name) or ``netty-buffer-4.2.13.Final.jar``
    (Spark's): ``netty-buffer``."""
    base = jar_name.split("_", 1)[1] if "_" in jar_name else jar_name
    found = re.match(r"^(.*?)-\d", base)
    return found.group(1) if found else base


def connector_class_path() -> list[str]:
    """The S3A connector's JARs for ``extraClassPath``, which comes BEFORE Spark's own JARs: without
    the libraries Spark already ships (netty, slf4j, httpclient, commons-codec; commons-logging, whose
    classes Spark's jcl-over-slf4j has). In ``spark.jars`` Spark's copies win anyway (parent first);
    in front of them the SDK's older netty breaks Spark's RPC."""
    import pyspark

    from dpspark.session import cached_s3a_jars

    spark_has = {_artifact(name) for name in os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))}
    spark_has.add("commons-logging")
    return [jar for jar in cached_s3a_jars(fetch=True) if _artifact(os.path.basename(jar)) not in spark_has]


def read_text(spark, uri: str) -> str:
    """A small file at a Hadoop URI, read through the session's Hadoop FileSystem."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(path)
    try:
        return jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
