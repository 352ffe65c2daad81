/* The public headers on their own, as strict C99 (built with -pedantic -Werror). */
#include <kvmdirty-migrate.h>
#include <kvmdirty.h>

int main(void)
{
	kvmdirty_vm_free(NULL);
	kvmdirty_mig_guest_free(NULL);
	return KVMDIRTY_CAP_COUNT > 0 && kvmdirty_mig_stream_version() > 0 ? 0 : 1;
}
