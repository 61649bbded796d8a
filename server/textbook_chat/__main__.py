from textbook_chat.cli import main

raise SystemExit(main())
