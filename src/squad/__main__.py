from squad._entry import main

main()
