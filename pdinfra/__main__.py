from pdinfra.cli import app

app()
