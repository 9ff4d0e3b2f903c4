"""One-off studies: measurements that settled a question (docs/decisions.md records their findings), kept so they
can be run again; not parts of the suite. Each runs as `python -m bench.studies.NAME`."""
