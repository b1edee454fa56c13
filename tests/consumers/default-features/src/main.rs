//! Opens the first GPU and reports which PTX build it would load, or that there is none.

use paged_decode::{Device, Error, ptx};

fn main() -> Result<(), Error> {
    match Device::open(0) {
        Ok(device) => {
            let cc = paged_decode::device::DeviceProps::query(&device.ctx)?.compute_capability;
            println!("{}: loads the {:?} PTX build", device.name()?, ptx::build_for(cc));
        }
        Err(Error::NoDevice) => println!("no CUDA driver or GPU on this machine"),
        Err(e) => return Err(e),
    }
    println!("{} kernel entry points embedded", ptx::entries(ptx::PTX).len());
    Ok(())
}
