from helpers.course.bench import main

main()
