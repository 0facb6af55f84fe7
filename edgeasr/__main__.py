from edgeasr.cli import main

raise SystemExit(main())
