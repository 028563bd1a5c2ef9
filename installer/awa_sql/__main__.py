from awa_sql.cli import main

raise SystemExit(main())
