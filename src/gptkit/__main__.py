from gptkit.cli import main

raise SystemExit(main())
