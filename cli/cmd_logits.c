/* cmd_logits.c - placeholder until the command lands (foundation issue, in progress). */
#include <stdio.h>
#include "cli/commands.h"
int ft_cmd_logits(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "ftune: 'logits' is not built yet\n");
    return 1;
}
