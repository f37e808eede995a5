// See ../../README.md: declarations only, for c10d's ProcessGroupGloo.hpp.
#pragma once

namespace gloo::transport {

class Device;
class UnboundBuffer;

}  // namespace gloo::transport
