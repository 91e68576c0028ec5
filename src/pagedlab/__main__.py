from pagedlab.cli import main

main()
