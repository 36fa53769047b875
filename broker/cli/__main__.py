from broker.command import main

main()
