"""`python -m vitpose COMMAND ...` is the `vitpose` console script."""

from vitpose.cli import main

raise SystemExit(main())
