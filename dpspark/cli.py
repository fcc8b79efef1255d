"""The ``dpspark`` command (and ``spark-submit jobs/cluster.py``, same arguments).

    dpspark run --config conf/demo.yaml [--set KEY=VALUE ...] [--run-id ID]
    dpspark validate --config conf/demo.yaml [--set KEY=VALUE ...]
    dpspark advance --config conf/ldp-ingest.yaml      # ldp ingest mode: publish the next round

Exit codes: 0 success; 2 invalid config or arguments (reported before Spark
starts, naming the key and what is allowed); 3 refused by the privacy budget;
1 any other failure.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpspark.errors import ConfigError, DPSparkError

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_BUDGET = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own exit code for usage errors is 2 as well
        self.print_usage(sys.stderr)
        print(f"dpspark: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dpspark", description="Differentially private k-means / k-median clustering on Spark.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, text in (("run", "run a clustering job"), ("validate", "validate a config and exit (no Spark)"),
                       ("advance", "ldp ingest mode: publish every round whose reports are in; release nothing")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, help="YAML config file")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key (repeatable)")
        if name == "run":
            p.add_argument("--run-id", default=None, help="run id (letters, digits, . _ -); default: time + random")
    return parser


def main(argv: list[str] | None = None, spark=None) -> int:
    """Entry point. ``spark`` lets tests pass a shared session; otherwise one is built."""
    from dpspark.progress import configure_logging

    configure_logging()
    args = build_parser().parse_args(argv)
    try:
        from dpspark.config import load_config
        from dpspark.tables import RUN_ID_PATTERN

        config = load_config(args.config, args.set)
        if getattr(args, "run_id", None) is not None and not RUN_ID_PATTERN.match(args.run_id):
            raise ConfigError("--run-id", f"{args.run_id!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    except ConfigError as exc:
        print(f"dpspark: invalid config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "validate":
        print(json.dumps(config.to_dict(), indent=2, default=str))
        return EXIT_OK
    if args.command == "advance" and not (config.algorithm.name == "ldp" and getattr(config.algorithm.params, "mode", None) == "ingest"):
        print("dpspark: invalid config: config key 'algorithm.mode': `dpspark advance` needs algorithm.name=ldp with mode=ingest",
              file=sys.stderr)
        return EXIT_CONFIG

    try:
        if spark is None:
            from dpspark.session import build_session

            spark = build_session(config.spark.master, config.spark.app_name, dict(config.spark.conf))
        if args.command == "advance":
            # Publishes round parameters computed from clients' LDP reports (post-processing of
            # what the clients already released); reads no private rows, charges nothing.
            from dpspark.ldp.estimator import LocalDP

            status = LocalDP.from_config(config).advance(spark)
            print(status.get("message") or "ldp ingest: all rounds' reports are in; `dpspark run` releases the centers")
            return EXIT_OK
        from dpspark.runner import run

        result = run(config, spark, run_id=args.run_id)
    except DPSparkError as exc:
        print(f"dpspark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # any other failure: exit 1 with the reason
        print(f"dpspark: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    _print_result(result)
    return EXIT_OK


def _print_result(result) -> None:
    s = result.summary
    print(f"run {s['run_id']}: {s['status']} ({s['algorithm']}, {s['objective']}, k={s['k']})")
    print(f"privacy spent: epsilon={s['epsilon_spent']:.6g}, delta={s['delta_spent']:.3g}"
          + ("   [fixed seed: testing aid, NOT private]" if s["randomness"]["seed"] is not None else ""))
    print("released centers (original units) and noisy weights:")
    names = s["feature_names"]
    print("  " + "  ".join(f"{n:>12s}" for n in names) + "  noisy_weight")
    for center, weight in zip(s["centers"], s["noisy_weights"]):
        print("  " + "  ".join(f"{v:12.5g}" for v in center) + f"  {weight:12.1f}")
    print("outputs:")
    width = max((len(key) for key in s["outputs"]), default=0)
    for key, path in s["outputs"].items():
        print(f"  {key:{width}s} {path}")


if __name__ == "__main__":
    sys.exit(main())
