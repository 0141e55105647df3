from torch_emugpu.cli.commands import main

raise SystemExit(main())
