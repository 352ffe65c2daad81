// The public header from C++.
#include <kvmdirty.h>

int main()
{
	struct kvmdirty_vm *vm = nullptr;
	kvmdirty_vm_free(vm);
	return KVMDIRTY_CAP_COUNT > 0 ? 0 : 1;
}
