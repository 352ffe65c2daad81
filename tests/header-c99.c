/* The public header on its own, as strict C99 (built with -pedantic -Werror). */
#include <kvmdirty.h>

int main(void)
{
	kvmdirty_vm_free(NULL);
	return KVMDIRTY_CAP_COUNT > 0 ? 0 : 1;
}
