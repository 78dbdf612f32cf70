from gpu_tailor.cli import main

raise SystemExit(main())
