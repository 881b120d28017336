"""``python -m gpufeed`` is the ``gpufeed`` command."""

from gpufeed.cli.main import main

raise SystemExit(main())
