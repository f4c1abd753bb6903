/* cmd_tokenize.c - placeholder until the command lands (foundation issue, in progress). */
#include <stdio.h>
#include "cli/commands.h"
int ft_cmd_tokenize(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "ftune: 'tokenize' is not built yet\n");
    return 1;
}
