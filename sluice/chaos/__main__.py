from sluice.chaos.cli import main

main()
