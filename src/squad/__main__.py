from squad.cli import main

main()
