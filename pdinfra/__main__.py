from pdinfra.cli.main import run

run()
