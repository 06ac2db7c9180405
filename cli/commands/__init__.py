"""One module per command, each a thin click command: parse, call one library function, print.
``main.COMMANDS`` names them; what several commands share lives beside this folder
(``output``, ``params``, ``serving``, ``targets``, ``scanning``, ``deleting``, ``transferring``)."""
