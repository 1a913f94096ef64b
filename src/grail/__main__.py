from grail.cli import run

run()
