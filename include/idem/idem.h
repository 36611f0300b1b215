#pragma once

// The umbrella header: everything an application needs.

#include "idem/clock.h"
#include "idem/codec.h"
#include "idem/error.h"
#include "idem/executor.h"
#include "idem/inbox.h"
#include "idem/metrics.h"
#include "idem/open_store.h"
#include "idem/purger.h"
#include "idem/store.h"
#include "idem/store_wrapper.h"
#include "idem/stores/memory_store.h"
#include "idem/transaction.h"
#include "idem/types.h"
#include "idem/version.h"
