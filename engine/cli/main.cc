// The `switchyard` command: dispatches to subcommands.
int main() { return 0; }
