from helpers.data import main

main()
