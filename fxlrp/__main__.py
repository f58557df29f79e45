"""``python -m fxlrp ...`` is the ``fxlrp`` command; ``torchrun --nproc-per-node N -m fxlrp explain
--data ...`` runs it in N processes (see docs/datasets.md)."""

from fxlrp.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
