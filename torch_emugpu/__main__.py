from torch_emugpu.cli import main

raise SystemExit(main())
