// The public headers from C++.
#include <kvmdirty-migrate.h>
#include <kvmdirty.h>

int main()
{
	struct kvmdirty_vm *vm = nullptr;
	kvmdirty_vm_free(vm);
	kvmdirty_mig_guest_free(nullptr);
	return KVMDIRTY_CAP_COUNT > 0 && kvmdirty_mig_stream_version() > 0 ? 0 : 1;
}
