from forensics.cli import console

console()
