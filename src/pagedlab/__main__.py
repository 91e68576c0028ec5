from pagedlab.tools.cli import main

main()
