from .main import console_main

console_main()
